fn main() {
    // JNI_OnLoad and every Java_io_shardlimit_* function of the sources
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src");
    let mut names = vec!["JNI_OnLoad".to_string()];
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    for entry in std::fs::read_dir(src).expect("read src") {
        let path = entry.expect("read src").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            for part in text.split("fn Java_io_shardlimit_").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                names.push(format!("Java_io_shardlimit_{name}"));
            }
        }
    }
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
