"""From a ggml source to a loaded library: choosing and fetching the source, the cache,
the CMake build of ggml plus our shim (native/), and the cffi binding (cdefs/)."""
