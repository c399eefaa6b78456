// macOS needs `-undefined dynamic_lookup` for an extension module built by plain cargo
// (maturin adds it itself); elsewhere this prints nothing.
fn main() {
    // Without a rerun-if-changed line cargo reruns this script, and rebuilds the extension
    // (a release build with LTO: minutes), whenever any file of the package changes,
    // Python sources and tests included. Nothing here reads a file.
    println!("cargo:rerun-if-changed=build.rs");
    pyo3_build_config::add_extension_module_link_args();
}
