//! Gives libshardlimit.so a SONAME, libshardlimit.so.<major>, so that programs linked
//! against the SDK (lib/libshardlimit.so -> libshardlimit.so.<major>) record the major
//! version they were built for and the loader refuses an incompatible one. On macOS the
//! same role is the install name, @rpath/libshardlimit.<major>.dylib (the SDK's file).
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let major =
        std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets CARGO_PKG_VERSION_MAJOR");
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libshardlimit.so.{major}");
    } else if os == "macos" {
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/libshardlimit.{major}.dylib"
        );
    }
    println!("cargo:rerun-if-changed=build.rs");
    // the functions of the header, the C ABI
    let header = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include/shardlimit.h");
    println!("cargo:rerun-if-changed={header}");
    let text = std::fs::read_to_string(header).expect("read include/shardlimit.h");
    // every word `shardlimit_<lowercase, digits, _>` followed by `(`
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names: Vec<String> = text
        .match_indices("shardlimit_")
        .filter(|(i, _)| !text[..*i].ends_with(ident))
        .map(|(i, _)| &text[i..])
        .filter_map(|rest| {
            let name = rest.split(|c: char| !ident(c)).next()?;
            let tail = &name["shardlimit_".len()..];
            let lower = tail
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            (!tail.is_empty() && lower && rest[name.len()..].starts_with('('))
                .then(|| name.to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    windows_exports(&names);
}

/// Windows (MinGW): the DLL's exports, as a .def file the linker takes as an input. rustc
/// writes one itself but passes it as `-Wl,<file>`, which cargo-zigbuild drops (zig's driver
/// takes a .def only as an input file), and the DLL would then export every symbol it holds.
fn windows_exports(names: &[String]) {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("windows") {
        return;
    }
    let def = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("exports.def");
    std::fs::write(&def, format!("EXPORTS\n    {}\n", names.join("\n    ")))
        .expect("write exports.def");
    println!("cargo:rustc-cdylib-link-arg={}", def.display());
}
