"""rules_cc's defs.bzl as Bazel 4 needs it: the native C++ rules."""
cc_library = native.cc_library
cc_binary = native.cc_binary
cc_test = native.cc_test
cc_import = native.cc_import
cc_proto_library = native.cc_proto_library
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
fdo_prefetch_hints = native.fdo_prefetch_hints
fdo_profile = native.fdo_profile
objc_library = native.objc_library
objc_import = native.objc_import
