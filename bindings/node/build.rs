fn main() {
    napi_build::setup();
    windows_exports(&["napi_register_module_v1".to_string()]);
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
