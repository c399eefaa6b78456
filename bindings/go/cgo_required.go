//go:build !cgo

package shardlimit

// This package wraps the shardlimit C library through cgo: it cannot be built with
// CGO_ENABLED=0, nor cross-compiled without a C cross-compiler and a C SDK built for the
// target. Without this file such a build fails with only "undefined: Limiter"; with it,
// the first error names the cause.
//
// To build: CGO_ENABLED=1 (the default for native builds), a C compiler, and the
// shardlimit C SDK on PKG_CONFIG_PATH (see README.md, Install). For a cross build, set
// CC to a cross-compiler and PKG_CONFIG_PATH to an SDK built for GOOS/GOARCH.
const _ = shardlimit_needs_cgo__build_with_CGO_ENABLED_1_and_the_C_SDK_on_PKG_CONFIG_PATH__see_the_README_Install_section
