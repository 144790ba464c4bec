/* Opaque ggml types. Python only ever holds pointers to them. */
struct ggml_context;
struct ggml_tensor;
struct ggml_cgraph;
