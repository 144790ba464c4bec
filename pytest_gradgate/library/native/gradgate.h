/* pytest-gradgate shim: the stable C surface that Python binds with cffi.
 *
 * This file is read twice: by gradgate_shim.c (after the ggml headers) and by
 * pytest_gradgate/binding.py as a cffi cdef. Keep it to plain declarations:
 * no #include, no macros, no struct bodies. Python never sees a ggml struct layout;
 * everything it needs from a tensor goes through the accessors below.
 */

/* Bumped whenever a declaration here changes; binding.py refuses a library built
 * from another revision of this file instead of calling into the wrong signature. */
int gg_abi_version(void);
const char * gg_ggml_version(void);

/* contexts and tensors (metadata only; data lives in a backend buffer) */
struct ggml_context * gg_ctx_new(size_t n_tensors, size_t graph_size);
void gg_ctx_free(struct ggml_context * ctx);
struct ggml_tensor * gg_new_tensor(struct ggml_context * ctx, int is_i32, int n_dims, const int64_t * ne);
void gg_tensor_layout(const struct ggml_tensor * t, int64_t * ne, size_t * nb);
size_t gg_tensor_nbytes(const struct ggml_tensor * t);
int gg_tensor_is_f32(const struct ggml_tensor * t);
const char * gg_tensor_op_name(const struct ggml_tensor * t);

/* graphs */
struct ggml_cgraph * gg_graph_forward(struct ggml_context * ctx, struct ggml_tensor * loss, size_t graph_size);
// gb in graph_ctx, the gradients' tensors in ctx
struct ggml_cgraph * gg_graph_backward(struct ggml_context * graph_ctx, struct ggml_context * ctx, struct ggml_cgraph * gf,
                                       size_t graph_size);
int gg_graph_n_nodes(struct ggml_cgraph * g);

/* a session owns one backend and the buffer holding one context's tensors */
struct gg_session;
struct gg_session * gg_session_new(const char * backend, int n_threads, char * err, size_t err_len);
void gg_session_free(struct gg_session * s);
void gg_session_set_n_threads(struct gg_session * s, int n_threads);
const char * gg_session_backend_name(struct gg_session * s);
/* first tensor of ctx the backend cannot run, or NULL */
struct ggml_tensor * gg_session_first_unsupported(struct gg_session * s, struct ggml_context * ctx);
int gg_session_alloc(struct gg_session * s, struct ggml_context * ctx);
int gg_session_compute(struct gg_session * s, struct ggml_cgraph * g);

/* Memory checks. gg_session_alloc lays out every tensor of the context that owns memory with a
 * guard zone of its own before and after its data, each filled with a pattern of its tensor and
 * side, and starts all data as 0xFFFFFFFF words (a NaN no kernel computes: "unwritten").
 * gg_session_guard_check: the first changed zone (its tensor's index k, side -1 before the data
 * or +1 after it, the nearest and farthest changed byte counted away from the data, and how many
 * bytes changed); 0 when every zone holds its pattern. gg_session_guard_fill writes the patterns
 * again. gg_session_guard_replay computes g one node at a time and returns the index of the first
 * node after which a zone changed (-1: none; -2: a compute failed). gg_session_unwritten: the
 * index of g's first node (compute order) that owns its memory and still holds unwritten words,
 * with their count and the first one's logical index; -1 when there is none. */
int gg_session_n_guarded(struct gg_session * s);
struct ggml_tensor * gg_session_guarded_tensor(struct gg_session * s, int k);
int gg_session_guard_check(struct gg_session * s, int * k, int * side, int64_t * first, int64_t * last, int64_t * n_changed);
void gg_session_guard_fill(struct gg_session * s);
int gg_session_guard_replay(struct gg_session * s, struct ggml_cgraph * g);
int gg_session_unwritten(struct gg_session * s, struct ggml_cgraph * g, int64_t * n_unwritten, int64_t * first);
struct ggml_tensor * gg_graph_node(struct ggml_cgraph * g, int i);
const char * gg_tensor_name(const struct ggml_tensor * t);
void gg_tensor_write(struct ggml_tensor * t, const void * data, size_t offset, size_t size);
void gg_tensor_read(const struct ggml_tensor * t, void * data, size_t offset, size_t size);
int gg_backend_count_gpu(void);

/* Allocation regimes (check/regimes.py): the backward graph in the memory training gives it.
 * gg_ctx_detach: every tensor of ctx forgets its memory, so that its graphs can be laid out again
 * (by the next gg_session_alloc* of a session; the memory the tensors had stays the session's
 * until then). gg_session_alloc_graph: g laid out as ggml-opt lays a training step: the statics
 * (params, the loss's gradient accumulator) in a buffer of their own, the outputs flagged so, the
 * other leaves flagged as inputs, everything else by ggml's graph allocator
 * (ggml_gallocr_alloc_graph) with its in-place reuse. gg_graph_alias_candidates: the index of
 * every node of g that ggml's allocator may run in place (ggml_op_can_inplace) whose src `which`
 * it could legally write its output over: same layout, memory of its own (no view, no param), no
 * tensor in keep lies in it, and nothing after the node reads it; returns their count.
 * gg_session_alloc_aliased: gg_session_alloc (guard zones and all) with node nodes[k]'s output
 * laid over its src srcs[k], in graph order. gg_graph_aliases: after an allocation, the nodes of
 * g whose output shares its address with one of their sources, and that source's index. */
void gg_ctx_detach(struct ggml_context * ctx);
/* frees what the session allocated for a context (its tensors keep dangling addresses: detach them) */
void gg_session_release(struct gg_session * s);
int gg_op_can_inplace(const struct ggml_tensor * t);
int gg_session_alloc_graph(struct gg_session * s, struct ggml_context * ctx, struct ggml_cgraph * g,
                           struct ggml_tensor ** statics, int n_statics, struct ggml_tensor ** outputs, int n_outputs);
int gg_graph_alias_candidates(struct ggml_cgraph * g, int which, struct ggml_tensor ** keep, int n_keep, int * nodes,
                              int max);
int gg_session_alloc_aliased(struct gg_session * s, struct ggml_context * ctx, struct ggml_cgraph * g, const int * nodes,
                             const int * srcs, int n);
int gg_graph_aliases(struct ggml_cgraph * g, int * nodes, int * srcs, int max);
struct ggml_tensor * gg_tensor_src(const struct ggml_tensor * t, int j);

/* ggml-opt's own path (check/regimes.py): gg_opt_new lays the leaves of ctx (params, inputs,
 * constants) in a static buffer and makes a ggml-opt context over a scheduler of the session's
 * backend: static graphs in ctx (which needs room for ggml-opt's graphs), loss SUM over
 * `outputs`, SGD with learning rate lr and weight decay 0, opt_period micro-batches per step
 * (more than 1: gradient accumulators, which gg_opt_grad_acc returns). gg_opt_step: one
 * micro-batch (ggml_opt_alloc + ggml_opt_eval). NULL from gg_opt_new: out of memory. */
struct gg_opt;
int gg_opt_supported(void);     /* 0: this tree's ggml-opt predates its SGD optimizer (2025-08) */
struct gg_opt * gg_opt_new(struct gg_session * s, struct ggml_context * ctx, struct ggml_tensor * outputs, int opt_period,
                           float lr);
void gg_opt_step(struct gg_opt * o);
struct ggml_tensor * gg_opt_grad_acc(struct gg_opt * o, struct ggml_tensor * param);
void gg_opt_free(struct gg_opt * o);

/* The hot loops: perturb one parameter, run the forward graph, read the loss.
 * Elements are visited in logical order (i0 fastest) through the tensor's strides.
 *
 * gg_numeric_grad: g_h[i] = (L(x+h) - L(x-h)) / 2h for every element; when g_half is
 * not NULL also g_half[i] = (L(x+h/2) - L(x-h/2)) / h (the 4-point stencil's other half).
 * Returns 0, or the ggml_status of the first failed compute. */
int gg_numeric_grad(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                    struct ggml_tensor * loss, float h, double * g_h, double * g_half);

/* The same for the elements listed in idx (logical indices), for locating an error
 * found in fast mode without visiting every element. */
int gg_numeric_grad_at(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                       struct ggml_tensor * loss, float h, const int64_t * idx, int64_t n_idx,
                       double * g_h, double * g_half);

/* The even part of the loss around the elements listed in idx: even[k] = L(x+h) + L(x-h) - 2 L(x)
 * (h^2 times the curvature where the loss is smooth over the step). The central differences
 * see only the odd part; a pole or a kink inside the step shows in this one (check/reliability.py). */
int gg_loss_even_at(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                    struct ggml_tensor * loss, float h, const int64_t * idx, int64_t n_idx, double * even);

/* gg_numeric_grad over n_lanes copies of one forward graph at once, each lane on a thread of
 * its own (lane 0 the caller's) with its own session, graph, param and loss, all built from
 * one case: each forward still runs on one thread, and an element's estimate is the same
 * whichever lane takes it. Lanes take elements in chunks as they go. busy[k]: lane k's
 * thread CPU seconds. */
int gg_numeric_grad_lanes(struct gg_session ** sessions, struct ggml_cgraph ** graphs, struct ggml_tensor ** params,
                          struct ggml_tensor ** losses, int n_lanes, float h, double * g_h, double * g_half,
                          double * busy);

/* gg_directional: for each of n_dirs directions u (n_dirs x nelements, row-major),
 * d_h[k] = (L(x+h u) - L(x-h u)) / 2h and, when d_half is not NULL, the same at h/2. */
int gg_directional(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                   struct ggml_tensor * loss, const float * dirs, int n_dirs, float h,
                   double * d_h, double * d_half);

/* The physical limit the numeric loops are measured against (bench/): seconds per plain
 * ggml_graph_compute of gf over n_runs runs (CPU, tensors already allocated, the plan made
 * once, nothing written or read between runs); -1 on failure. */
double gg_bare_compute_seconds(struct ggml_cgraph * gf, int n_threads, int n_runs);

/* the loss value after the last forward compute */
double gg_read_scalar(struct ggml_tensor * t);
