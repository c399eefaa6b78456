// macOS needs `-undefined dynamic_lookup` for an extension module built by plain cargo
// (maturin adds it itself); elsewhere this prints nothing.
fn main() {
    pyo3_build_config::add_extension_module_link_args();
}
