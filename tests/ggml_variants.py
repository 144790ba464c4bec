"""Variants of a ggml tree, made by patching a copy of it at short anchors.

Used by the tests, the benchmark and the HTML demo to put a known bug into a real ggml
(or take one out) instead of imitating ggml in Python. Each patch inserts code we wrote
before a one-line anchor (a `case GGML_OP_...:` label) in src/ggml.c, replaces one line
(sub-sign, transpose-reshape, transpose-half, and the variants the suite does not catch), or
(deaths) goes after a one-line anchor in the CPU SCALE kernel; the thread-boundary and
input-strides variants replace a line of a CPU backward kernel.
"""

from pathlib import Path

from pytest_gradgate.library.source import copy_tree

# where new backward cases go: the first label after the unary block of ggml_compute_backward
BACKWARD_ANCHOR = "        case GGML_OP_WIN_PART:\n"

# A CONCAT backward as forks write it. {grad_expr} is what the slices are taken from:
# `grad` itself (BUGGY: ggml_view_4d assumes the first stride is the element size, which
# is false once the gradient arrives through a transpose/permute) or `ggml_cont(ctx, grad)`
# (FIXED: slice a contiguous copy).
_CONCAT_BACKWARD = """\
        case GGML_OP_CONCAT: {{ // added by pytest-gradgate's {variant} test variant
            const int32_t dim = ggml_get_op_params_i32(tensor, 0);
            struct ggml_tensor * g = {grad_expr};
            if (src0_needs_grads) {{
                struct ggml_tensor * g0 = ggml_view_4d(ctx, g, src0->ne[0], src0->ne[1], src0->ne[2], src0->ne[3],
                                                       g->nb[1], g->nb[2], g->nb[3], 0);
                ggml_add_or_set(ctx, cgraph, isrc0, ggml_cont(ctx, g0));
            }}
            if (src1_needs_grads) {{
                const size_t offset = src0->ne[dim] * g->nb[dim];
                struct ggml_tensor * g1 = ggml_view_4d(ctx, g, src1->ne[0], src1->ne[1], src1->ne[2], src1->ne[3],
                                                       g->nb[1], g->nb[2], g->nb[3], offset);
                ggml_add_or_set(ctx, cgraph, isrc1, ggml_cont(ctx, g1));
            }}
        }} break;
"""

CONCAT_VARIANTS = {
    "concat-buggy": _CONCAT_BACKWARD.format(variant="concat-buggy", grad_expr="grad"),
    "concat-fixed": _CONCAT_BACKWARD.format(variant="concat-fixed", grad_expr="ggml_cont(ctx, grad)"),
}


# The "deaths" variant: the CPU SCALE kernel dies on purpose for magic scale factors, so
# the isolation tests see real deaths in the compute phase: s = 13 writes through a NULL
# pointer (SIGSEGV), s = 17 spins forever (a hang), s = 19 allocates and touches 16 MiB at
# a time without bound (GGML_ABORT once malloc fails, i.e. under a memory cap), and s = 23
# is wrong in a process that computed s = 29 before (a leak between cases).
# The pointer is read through a volatile so that the compiler cannot see it is NULL and
# turn the store into a trap instruction (SIGILL) instead.
DEATHS_ANCHOR = "    memcpy(&b, (float *) dst->op_params + 1, sizeof(float));\n"
_DEATHS_CODE = """\
    { // added by pytest-gradgate's deaths test variant
        if (s == 13.0f) { float * volatile nowhere = NULL; *nowhere = b; }
        if (s == 17.0f) { for (volatile unsigned long spin = 0; ; spin++) { } }
        // s = 29 marks the process; in a marked process s = 23 scales by 24 when it runs on
        // more than one thread (the analytic pass, not the one-thread finite differences): a
        // kernel whose static state leaks from one case into the next (isolation's child reuse)
        static volatile int marked_by_29 = 0;
        if (s == 29.0f) { marked_by_29 = 1; }
        if (s == 23.0f && marked_by_29 && params->nth > 1) { s = 24.0f; }
        if (s == 19.0f) {
            for (size_t mib = 0; ; mib += 16) {
                char * chunk = (char *) malloc((size_t) 16 << 20);
                if (chunk == NULL) {
                    GGML_ABORT("gradgate deaths variant: malloc failed after %zu MiB", mib);
                }
                memset(chunk, 1, (size_t) 16 << 20);
            }
        }
    }
"""

# The "flaky-scale" variant: a verdict that changes from run to run, as a data race's does, but
# on a schedule the test sets. Where $GRADGATE_TEST_FLAKY_PATTERN (e.g. "FFFFP") and
# $GRADGATE_TEST_FLAKY_COUNTER (a file) are set, each process that runs the CPU SCALE kernel on
# more than one thread (the analytic pass; the finite differences' forwards run on one) appends
# a byte to the counter file once, and is wrong (thread 0's rows scaled by 1.5 s) for the whole
# process if the pattern's letter at that count is F. So a case's run in a fresh child fails or
# passes by the pattern, and 5 runs against "FFFFP" fail exactly 4 times. Unset, it is the
# default ggml.
_FLAKY_SCALE_CODE = """\
    { // added by pytest-gradgate's flaky-scale test variant
        static int decided = 0, wrong = 0;      // once per process: a forked child decides anew
        const char * pattern = getenv("GRADGATE_TEST_FLAKY_PATTERN");
        const char * counter = getenv("GRADGATE_TEST_FLAKY_COUNTER");
        if (params->nth > 1 && params->ith == 0 && pattern && *pattern && counter) {
            if (!decided) {
                decided = 1;
                FILE * f = fopen(counter, "ab");
                if (f) {
                    fputc('.', f);
                    fseek(f, 0, SEEK_END);
                    const long n = ftell(f);
                    fclose(f);
                    wrong = pattern[(n - 1) % (long) strlen(pattern)] == 'F';
                }
            }
            if (wrong) { s *= 1.5f; }
        }
    }
"""

# The "thread-boundary" variant: the CPU SILU_BACK kernel (SILU's backward) loses a row at
# every thread boundary: each thread but the last stops one row short of its range, as an
# off-by-one in a kernel's ir0/ir1 split does. On one thread it is exact.
THREAD_BOUNDARY_ANCHOR = "    for (int i1 = ir0; i1 < ir1; i1++) {\n        ggml_vec_silu_backward_f32(nc,\n"
_THREAD_BOUNDARY_CODE = """\
    // added by pytest-gradgate's thread-boundary test variant
    const int ir1_short = (nth > 1 && ith < nth - 1) ? ir1 - 1 : ir1;
    for (int i1 = ir0; i1 < ir1_short; i1++) {
        ggml_vec_silu_backward_f32(nc,
"""
# The "last-element" variant: the CPU SILU_BACK kernel gets one element wrong, the last of the
# last row: its gradient is the incoming gradient alone, as if silu'(x) were 1 (a kernel that
# computes one element from the wrong input, as one of CUDA's planted bugs did). The kernel's
# vector call covers the row but that element, so every other element stays right.
_LAST_ELEMENT_CODE = """\
    for (int i1 = ir0; i1 < ir1; i1++) {
        if (i1 == nr - 1) { // added by pytest-gradgate's last-element test variant
            ((float *) ((char *) dst->data + i1*dst->nb[1]))[nc - 1] = ((float *) ((char *) grad->data + i1*grad->nb[1]))[nc - 1];
        }
        ggml_vec_silu_backward_f32(i1 == nr - 1 ? nc - 1 : nc,
"""
# The "heap-overflow" variant: the CPU SILU_BACK kernel computes each row in a scratch row it
# allocates on the heap, one element short of what it writes (the row's sum goes after the
# row: an off-by-one in the allocation's size). The gradient stays right, and the store lands
# in the allocator's slack for most row lengths (the shapes the tests use), so only a sanitizer
# build sees it. A write one past a tensor's own row would not do for such a test: every tensor
# of a case lies in one ggml buffer, so it lands in the next tensor, where ASan sees nothing
# (the guard zones' job). The store is volatile so that the compiler keeps a store nothing reads.
HEAP_OVERFLOW_MARK = "pytest-gradgate's heap-overflow test variant: the planted write"
_HEAP_OVERFLOW_HEAD = (THREAD_BOUNDARY_ANCHOR + "                (float *) ((char *) dst->data  + i1*( dst->nb[1])),\n",
                       THREAD_BOUNDARY_ANCHOR.replace("(nc,", "(nc, row,").replace(
                           "{\n", "{\n        float * row = (float *) malloc(nc*sizeof(float)); "
                                  "// added by pytest-gradgate's heap-overflow test variant\n", 1))
_HEAP_OVERFLOW_TAIL_ANCHOR = "                (float *) ((char *) grad->data + i1*(grad->nb[1])));\n"
_HEAP_OVERFLOW_TAIL = _HEAP_OVERFLOW_TAIL_ANCHOR + """\
        float sum = 0.0f;
        for (int k = 0; k < nc; k++) {
            sum += row[k];
        }
        ((volatile float *) row)[nc] = sum; // %s
        memcpy((char *) dst->data + i1*(dst->nb[1]), row, nc*sizeof(float));
        free(row);
""" % HEAP_OVERFLOW_MARK

# The "unwritten" variant: the CPU SILU_BACK kernel never writes the last element of its last
# row (its vector call stops one short there), as a kernel whose loop bound is off by one does:
# the element keeps whatever the memory held before, so the gradient read from it is arbitrary.
_UNWRITTEN_CODE = """\
    for (int i1 = ir0; i1 < ir1; i1++) {
        // pytest-gradgate's unwritten test variant: the last row's last element is never written
        ggml_vec_silu_backward_f32(i1 == nr - 1 ? nc - 1 : nc,
"""
# The "race" variant: after computing its rows, every thread of the CPU SILU_BACK kernel stores
# the sum of its own rows' last elements into the output's last element (a reduction whose
# per-thread partials are never combined). On one thread that element holds the whole sum; on
# several it holds whichever thread's partial sum was stored last. The kernel's own row loop
# follows, bounded to run no row.
_RACE_CODE = """\
    for (int i1 = ir0; i1 < ir1; i1++) {
        ggml_vec_silu_backward_f32(nc,
                (float *) ((char *) dst->data  + i1*( dst->nb[1])),
                (float *) ((char *) src1->data + i1*(src1->nb[1])),
                (float *) ((char *) grad->data + i1*(grad->nb[1])));
    }
    if (ir1 > ir0) { // pytest-gradgate's race test variant: one shared element, written by every thread
        float partial = 0.0f;
        for (int i1 = ir0; i1 < ir1; i1++) {
            partial += ((float *) ((char *) dst->data + i1*dst->nb[1]))[nc - 1];
        }
        ((float *) ((char *) dst->data + (nr - 1)*dst->nb[1]))[nc - 1] = partial;
    }
    for (int i1 = ir1; i1 < ir1; i1++) {
        ggml_vec_silu_backward_f32(nc,
"""
# The "tf32-matmul" variant: the CPU's f32 mul_mat rounds its inputs to TF32 (a 10-bit
# mantissa, to nearest even) and sums the products in f32, as ggml-cuda's cuBLAS calls do on
# tensor cores: the CPU stands in for CUDA's arithmetic, which --gradgate-tf32 cpu tells the
# limits. Only the F32 entry of the CPU's type traits changes (mul_mat's dot product).
# "tf32-matmul-scaled" adds a 1% scale error to mul_mat's backward for its first operand.
TF32_ANCHOR = "static const struct ggml_type_traits_cpu type_traits_cpu[GGML_TYPE_COUNT] = {\n"
_TF32_CODE = """\
// added by pytest-gradgate's tf32-matmul test variant
static float gradgate_tf32(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof(b));
    b = (b + 0xFFFu + ((b >> 13) & 1u)) & ~0x1FFFu;
    memcpy(&v, &b, sizeof(v));
    return v;
}
static void gradgate_vec_dot_tf32(int n, float * GGML_RESTRICT s, size_t bs, const float * GGML_RESTRICT x, size_t bx,
                                  const float * GGML_RESTRICT y, size_t by, int nrc) {
    GGML_UNUSED(bs); GGML_UNUSED(bx); GGML_UNUSED(by); GGML_UNUSED(nrc);
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        sum += gradgate_tf32(x[i]) * gradgate_tf32(y[i]);
    }
    *s = sum;
}
"""
TF32_DOT_LINE = "        .vec_dot                  = (ggml_vec_dot_t) ggml_vec_dot_f32,\n"
_TF32_DOT_CODE = "        .vec_dot                  = (ggml_vec_dot_t) gradgate_vec_dot_tf32, // pytest-gradgate's tf32-matmul\n"
MUL_MAT_SRC0_ANCHOR = "                ggml_add_or_set(ctx, cgraph, isrc0, tmp);\n"
_MUL_MAT_SCALED_CODE = ("                ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale(ctx, tmp, 1.01f));"
                        " // pytest-gradgate's tf32-matmul-scaled test variant\n")

# The "sub-sign" variant: SUB's backward adds b's gradient instead of subtracting it (the
# kind of sign bug RELU's backward once had). a's gradient stays right, b's is exactly -true.
SUB_SIGN_ANCHOR = "                ggml_sub_or_set(ctx, cgraph, isrc1, grad);\n"
_SUB_SIGN_CODE = "                ggml_add_or_set(ctx, cgraph, isrc1, grad); // pytest-gradgate's sub-sign test variant\n"

# The "transpose-reshape" variant: TRANSPOSE's backward reshapes the incoming gradient to the
# source's shape instead of transposing it: the right values, the right shape, at the wrong
# positions (an easy slip, since both give a tensor of src0's shape).
TRANSPOSE_ANCHOR = "                ggml_add_or_set(ctx, cgraph, isrc0, ggml_transpose(ctx, grad));\n"
_TRANSPOSE_RESHAPE_CODE = ("                ggml_add_or_set(ctx, cgraph, isrc0, ggml_reshape(ctx, ggml_cont(ctx, grad), src0));"
                           " // pytest-gradgate's transpose-reshape test variant\n")

# The "input-strides" variant: the CPU RMS_NORM_BACK kernel reads the forward input x as if it
# were contiguous (row i1 of plane i2 at ((i3*ne12 + i2)*ne11 + i1)*ne10 floats from its
# start), as a kernel written for contiguous activations does. Through a contiguous x it is
# exact; through a permuted or gapped view of x it reads other rows (or shifted ones).
INPUT_STRIDES_ANCHOR = "                const float * x  = (float *) ((char *) src1->data + i11*nb11 + i12*nb12 + i13*nb13);\n"
_INPUT_STRIDES_CODE = """\
                // pytest-gradgate's input-strides test variant: x read as if contiguous
                const float * x  = (const float *) src1->data + ((i13*ne12 + i12)*ne11 + i11)*ne10;
"""

# The "transpose-half" variant: TRANSPOSE's backward returns half the gradient, so that the
# producer `transpose` cannot carry a gradient on its own (its self-check must say so, and the
# op behind it must not be blamed), and aborts for a gradient with ne2 = 7 (a producer that
# dies in its self-check). No built-in op's backward uses TRANSPOSE's.
_TRANSPOSE_HALF_CODE = ("                GGML_ASSERT(grad->ne[2] != 7 && \"pytest-gradgate's transpose-half variant dies at ne2 = 7\");\n"
                        "                ggml_add_or_set(ctx, cgraph, isrc0, ggml_transpose(ctx, ggml_scale(ctx, ggml_cont(ctx, grad), "
                        "0.5f))); // pytest-gradgate's transpose-half test variant\n")

# Bugs the built-in suite does not catch (tests/test_explore.py): each is wrong only for a
# parameter or shape the suite never uses, so only a search finds it.
# "scale-negative": SCALE's backward scales the gradient by |s|, which is right for s > 0 only
# (the suite's scale case uses s = 0.7).
SCALE_ANCHOR = "                ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale_impl(ctx, grad, s, 0.0, false));\n"
_SCALE_NEGATIVE_CODE = ("                ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale_impl(ctx, grad, fabsf(s), 0.0, false));"
                        " // pytest-gradgate's scale-negative test variant\n")
# "rms-norm-eps": RMS_NORM's backward uses the default eps, not the forward's: right for
# eps = 1e-6 only (the suite's rms_norm case uses 1e-6).
RMS_NORM_ANCHOR = "                ggml_add_or_set(ctx, cgraph, isrc0, ggml_rms_norm_back(ctx, grad, src0, eps));\n"
_RMS_NORM_EPS_CODE = ("                ggml_add_or_set(ctx, cgraph, isrc0, ggml_rms_norm_back(ctx, grad, src0, 1e-6f));"
                      " // pytest-gradgate's rms-norm-eps test variant\n")
# "repeat-ne3": REPEAT's backward halves the gradient when the repeat goes along ne3 (as a
# backward that averages over batch copies instead of summing would): a shape bug, since the
# suite's repeat case repeats along ne0 and ne2 only.
REPEAT_ANCHOR = "                ggml_add_or_set(ctx, cgraph, isrc0, ggml_repeat_back(ctx, grad, src0));\n"
_REPEAT_NE3_CODE = ("                ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale(ctx, ggml_repeat_back(ctx, grad, src0),"
                    " tensor->ne[3] != src0->ne[3] ? 0.5f : 1.0f)); // pytest-gradgate's repeat-ne3 test variant\n")
UNCAUGHT_VARIANTS = {"scale-negative": (SCALE_ANCHOR, _SCALE_NEGATIVE_CODE),
                     "rms-norm-eps": (RMS_NORM_ANCHOR, _RMS_NORM_EPS_CODE),
                     "repeat-ne3": (REPEAT_ANCHOR, _REPEAT_NE3_CODE)}

# all three in one tree: one build for the tests that show explore finds each
UNCAUGHT = "uncaught"

# A fork's own op, as a fork adds one: ggml_walk_scale(ctx, a, s) = s * a, with its GGML_OP in
# include/ggml.h, its constructor and name in src/ggml.c, a CPU forward that reads a through its
# strides, and a backward case in ggml_compute_backward. "walk-scale" has a correct backward;
# "walk-scale-wrong" reads the incoming gradient as if it were laid out like a (src0's strides):
# right wherever the gradient arrives contiguous (consumer none), wrong positions through a
# transpose or permute. The tests declare it from YAML alone (tests/test_declared_ops.py).
WALK_SCALE_PROTOTYPE = "struct ggml_tensor * ggml_walk_scale(struct ggml_context * ctx, struct ggml_tensor * a, float s)"
_WALK_SCALE_ENUM = ("        GGML_OP_GLU,\n", "        GGML_OP_GLU,\n        GGML_OP_WALK_SCALE, // pytest-gradgate's walk-scale variant\n")
_WALK_SCALE_DECL = ("    GGML_API struct ggml_tensor * ggml_concat(",
                    "    GGML_API " + WALK_SCALE_PROTOTYPE + "; // pytest-gradgate's walk-scale variant\n\n"
                    "    GGML_API struct ggml_tensor * ggml_concat(")
_WALK_SCALE_NAMES = [('    "GLU",\n', '    "GLU",\n    "WALK_SCALE",\n'), ('    "glu(x)",\n', '    "glu(x)",\n    "walk_scale(x)",\n')]
_WALK_SCALE_BUILD = """\
// added by pytest-gradgate's walk-scale test variant: a fork's own op
""" + WALK_SCALE_PROTOTYPE + """ {
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, a->ne);
    ggml_set_op_params(result, &s, sizeof(s));
    result->op     = GGML_OP_WALK_SCALE;
    result->src[0] = a;
    return result;
}

"""
_WALK_SCALE_BACKWARD = """\
        case GGML_OP_WALK_SCALE: {{ // added by pytest-gradgate's {variant} test variant
            float s;
            memcpy(&s, tensor->op_params, sizeof(float));
            if (src0_needs_grads) {{
                struct ggml_tensor * g = {grad_expr};
                ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale(ctx, ggml_cont(ctx, g), s));
            }}
        }} break;
"""
WALK_SCALE_VARIANTS = {
    "walk-scale": _WALK_SCALE_BACKWARD.format(variant="walk-scale", grad_expr="grad"),
    "walk-scale-wrong": _WALK_SCALE_BACKWARD.format(
        variant="walk-scale-wrong",
        grad_expr="ggml_view_4d(ctx, grad, src0->ne[0], src0->ne[1], src0->ne[2], src0->ne[3], "
                  "src0->nb[1], src0->nb[2], src0->nb[3], 0)"),
}
# the CPU forward, one row per thread in turn, every element through the strides
_WALK_SCALE_FORWARD_ANCHOR = "        case GGML_OP_OPT_STEP_SGD:\n            {\n                ggml_compute_forward_opt_step_sgd(params, tensor);\n            }\n            break;\n"
_WALK_SCALE_FORWARD = """\
        case GGML_OP_WALK_SCALE: // added by pytest-gradgate's walk-scale test variant
            {
                const struct ggml_tensor * src = tensor->src[0];
                float s;
                memcpy(&s, tensor->op_params, sizeof(float));
                const int64_t n1 = tensor->ne[1], n2 = tensor->ne[2], rows = n1 * n2 * tensor->ne[3];
                for (int64_t r = params->ith; r < rows; r += params->nth) {
                    const int64_t i1 = r % n1, i2 = (r / n1) % n2, i3 = r / (n1 * n2);
                    for (int64_t i0 = 0; i0 < tensor->ne[0]; i0++) {
                        const float x = *(const float *) ((const char *) src->data + i0*src->nb[0] + i1*src->nb[1] + i2*src->nb[2] + i3*src->nb[3]);
                        *(float *) ((char *) tensor->data + i0*tensor->nb[0] + i1*tensor->nb[1] + i2*tensor->nb[2] + i3*tensor->nb[3]) = s * x;
                    }
                }
            }
            break;
"""
_WALK_SCALE_TASKS = ("        case GGML_OP_OPT_STEP_ADAMW:\n        case GGML_OP_OPT_STEP_SGD:\n            {\n                n_tasks = n_threads;",
                     "        case GGML_OP_WALK_SCALE: // pytest-gradgate's walk-scale variant\n"
                     "        case GGML_OP_OPT_STEP_ADAMW:\n        case GGML_OP_OPT_STEP_SGD:\n            {\n                n_tasks = n_threads;")

# Variants for the allocation regimes (check/regimes.py, tests/test_regimes.py).
# "silu-back-overwrites": the CPU SILU_BACK kernel first copies dy into dx, then multiplies dx by
# silu'(x), reading x after dx is written: right in memory of its own (and with dx over dy, its
# src0), wrong when the allocator lays dx over x, its src1, as the upstream SOFT_MAX_BACK is.
SILU_BACK_CALL = (THREAD_BOUNDARY_ANCHOR
                  + "                (float *) ((char *) dst->data  + i1*( dst->nb[1])),\n"
                  + "                (float *) ((char *) src1->data + i1*(src1->nb[1])),\n"
                  + "                (float *) ((char *) grad->data + i1*(grad->nb[1])));\n")
_SILU_BACK_OVERWRITES_CODE = """\
    for (int i1 = ir0; i1 < ir1; i1++) {
        { // pytest-gradgate's silu-back-overwrites test variant
            float * dx = (float *) ((char *) dst->data + i1*dst->nb[1]);
            const float * x = (const float *) ((char *) src1->data + i1*src1->nb[1]);
            const float * dy = (const float *) ((char *) grad->data + i1*grad->nb[1]);
            for (int k = 0; k < nc; k++) { dx[k] = dy[k]; }
            for (int k = 0; k < nc; k++) {
                const float sig = 1.0f/(1.0f + expf(-x[k]));
                dx[k] *= sig*(1.0f + x[k]*(1.0f - sig));
            }
        }
"""
# "softmax-back-fixed": the CPU SOFT_MAX_BACK kernel reads each y[i] and dy[i] before it writes
# dx[i] (as ggml 0.26.0's does): the upstream alias bug of 0.15.3 fixed.
SOFTMAX_BACK_STEPS = ("        ggml_vec_cpy_f32  (nc, dx, dy);\n"
                      "        ggml_vec_acc1_f32 (nc, dx, -dot_y_dy);\n"
                      "        ggml_vec_mul_f32  (nc, dx, dx, y);\n")
_SOFTMAX_BACK_FIXED_CODE = ("        for (int i = 0; i < nc; i++) { dx[i] = (dy[i] - dot_y_dy)*y[i]; }"
                            " // pytest-gradgate's softmax-back-fixed test variant\n")
# "scale-back-inplace": SCALE's backward scales its incoming gradient in place (a view of it),
# right where nothing else reads that gradient (scale alone) and wrong where another consumer
# still needs it (x + scale(x): the residual's share is scaled too).
_SCALE_BACK_INPLACE_CODE = ("                ggml_add_or_set(ctx, cgraph, isrc0, ggml_scale_impl(ctx, grad, s, 0.0, true));"
                            " // pytest-gradgate's scale-back-inplace test variant\n")
# "scale-reads-contiguous": a fork that "fixes" SCALE's abort on a non-contiguous gradient (the
# build-time assert in ggml_scale_impl and the kernel's contiguity assert taken out), so that the
# kernel reads a laid-out gradient as if it were contiguous: upstream's known crash becomes a
# wrong gradient under the same item id (issue 52).
SCALE_IMPL_ASSERT = ("    GGML_ASSERT(ggml_is_padded_1d(a));\n\n"
                     "    struct ggml_tensor * result = inplace ? ggml_view_tensor(ctx, a) : ggml_dup_tensor(ctx, a);\n\n"
                     "    float params[2] = { s, b };\n")
SCALE_KERNEL_ASSERT = ("    GGML_ASSERT(ggml_is_contiguous(src0));\n    GGML_ASSERT(ggml_is_contiguous(dst));\n"
                       "    GGML_ASSERT(ggml_are_same_shape(src0, dst));\n\n    float s; // scale factor\n")
REGIME_VARIANTS = ("silu-back-overwrites", "softmax-back-fixed", "scale-back-inplace", "scale-reads-contiguous",
                   "repeat-back-memo")
# "relu-unmasked": RELU's backward passes the incoming gradient through unmasked, also where the
# input is negative and the numeric gradient is 0 (issue 53: a diagnosis that claims what it saw)
RELU_BACKWARD_LINE = "ggml_add_or_set(ctx, cgraph, isrc0, ggml_mul(ctx, ggml_step(ctx, src0), grad));"
_RELU_UNMASKED_CODE = "ggml_add_or_set(ctx, cgraph, isrc0, grad); // pytest-gradgate's relu-unmasked test variant"
# "pool-max-negative": POOL_2D's max backward starts its search for the window's maximum at 0
# instead of -FLT_MAX, so a window whose values are all negative finds none and its gradient is
# lost; positive windows are right. Upstream has a pool_2d finding of its own (ties, values
# disagree): this one must not be taken for it (issue 52, explore's key)
POOL_MAX_START = "                    float maxval = -FLT_MAX;\n                    int kxmax = -1;\n"
_POOL_MAX_NEGATIVE_CODE = ("                    float maxval = 0.0f; // pytest-gradgate's pool-max-negative test variant\n"
                           "                    int kxmax = -1;\n")
# "rms-norm-back-batches": RMS_NORM_BACK reads x's rows of batch (i2, i3) at (i2 + i3) * nb12, a
# flattening that is right whenever ne2 or ne3 is 1: only a 4-D batch (ne2 > 1 and ne3 > 1) shows
# it (issue 53, batches axis)
_RMS_NORM_BACK_BATCHES_CODE = ("                const float * x  = (float *) ((char *) src1->data + i11*nb11 + (i12 + i13)*nb12);"
                               " // pytest-gradgate's rms-norm-back-batches test variant\n")
# "rope-back-no-yarn": ROPE's backward reads ext_factor as 0, so it rotates back without YaRN's
# ramp and magnitude correction: right at the defaults (ext_factor 0), which every rope case but
# rope_yarn uses (issue 53, op parameters)
ROPE_BACK_EXT_FACTOR = "                memcpy(&ext_factor,  (const float *) tensor->op_params +  7, sizeof(float));\n"
_ROPE_BACK_NO_YARN_CODE = "                ext_factor = 0.0f; // pytest-gradgate's rope-back-no-yarn test variant\n"
# "silu-back-unrolled": SILU's backward helper unrolled by 8, as SIMD kernels are, with the
# unrolled path reading dy one element off within each pair; the scalar tail is right, so only
# rows of 8 or more elements reach the bug (issue 53, sizes: every silu case had ne0 = 4)
SILU_BACK_HELPER = "inline static void ggml_vec_silu_backward_f32(const int n, float * dx, const float * x, const float * dy) {\n"
_SILU_BACK_UNROLLED_CODE = """\
inline static void ggml_vec_silu_backward_f32(const int n, float * dx, const float * x, const float * dy) {
    int i = 0; // pytest-gradgate's silu-back-unrolled test variant: a wrong unrolled path, a right tail
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; ++k) {
            dx[i + k] = ggml_silu_backward_f32(x[i + k], dy[i + (k ^ 1)]);
        }
    }
    for (; i < n; ++i) {
        dx[i] = ggml_silu_backward_f32(x[i], dy[i]);
    }
}
inline static void ggml_vec_silu_backward_f32_unused(const int n, float * dx, const float * x, const float * dy) {
"""
# "rms-norm-back-batch-swap": RMS_NORM_BACK writes batch (i2, i3)'s rows at (i3, i2): with ne2 = ne3
# every batch's gradient lands whole at another batch's place (issue 53: a diagnosis that says so)
RMS_NORM_BACK_DX = "                float * dx = (float *) ((char *) dst->data + i01*nb1 + i02*nb2 + i03*nb3);\n"
_RMS_NORM_BACK_BATCH_SWAP_CODE = ("                float * dx = (float *) ((char *) dst->data + i01*nb1 + i03*nb2 + i02*nb3);"
                                  " // pytest-gradgate's rms-norm-back-batch-swap test variant\n")
# "repeat-back-memo": the CPU REPEAT_BACK kernel keeps a copy of the result it last computed,
# with the address it wrote it to, and gives that copy when asked to write there again, as a
# cache keyed by its output would: right on every first evaluation and on a repeat with the same
# values, stale on the next evaluation with new ones in the same layout, which is what ggml-opt's
# second micro-batch is (its scheduler lays each step's copy of the graph out alike; issue 51:
# accumulation over micro-batches with other values; the same values twice sum right)
REPEAT_BACK_START = "static void ggml_compute_forward_repeat_back_f32(\n"
_REPEAT_BACK_MEMO_CODE = """\
static void ggml_compute_forward_repeat_back_f32_computed(const ggml_compute_params * params, ggml_tensor * dst);

static void ggml_compute_forward_repeat_back_f32(const ggml_compute_params * params, ggml_tensor * dst) {
    // pytest-gradgate's repeat-back-memo test variant
    static const void * written = NULL;
    static void * saved = NULL;
    static size_t saved_size = 0;
    if (params->ith != 0) {
        return;
    }
    if (dst->data == written && ggml_nbytes(dst) == saved_size) {
        memcpy(dst->data, saved, saved_size);
        return;
    }
    ggml_compute_forward_repeat_back_f32_computed(params, dst);
    free(saved);
    saved_size = ggml_nbytes(dst);
    saved = malloc(saved_size);
    memcpy(saved, dst->data, saved_size);
    written = dst->data;
}

static void ggml_compute_forward_repeat_back_f32_computed(
"""
DIAGNOSIS_VARIANTS = ("relu-unmasked", "pool-max-negative", "rms-norm-back-batches", "rope-back-no-yarn",
                      "silu-back-unrolled", "rms-norm-back-batch-swap")
# issue 53's reach bugs in one tree, one bug per op (pool_2d, rms_norm, rope, silu), and issue 51's
# repeat_back memo: one build for tests/test_reach.py and tests/test_regimes.py, which select each
# op's items
REACH = "reach"
REACH_VARIANTS = ("pool-max-negative", "rms-norm-back-batches", "rope-back-no-yarn", "silu-back-unrolled",
                  "repeat-back-memo")

VARIANTS = (tuple(CONCAT_VARIANTS) + ("deaths", "thread-boundary", "last-element", "heap-overflow", "unwritten", "race",
                                     "tf32-matmul", "tf32-matmul-scaled", "sub-sign", "input-strides", "transpose-half",
                                     "transpose-reshape", "flaky-scale") + tuple(UNCAUGHT_VARIANTS) + (UNCAUGHT,) + tuple(WALK_SCALE_VARIANTS)
            + REGIME_VARIANTS + DIAGNOSIS_VARIANTS + (REACH,))


class PatchError(Exception):
    pass


def insert_before(path, anchor, code):
    """Insert `code` before the single occurrence of `anchor` in `path`."""
    path = Path(path)
    text = path.read_text()
    count = text.count(anchor)
    if count != 1:
        raise PatchError(f"{path}: anchor {anchor.strip()!r} found {count} times, expected once")
    path.write_text(text.replace(anchor, code + anchor))


def replace_once(path, old, new):
    path = Path(path)
    text = path.read_text()
    if text.count(old) != 1:
        raise PatchError(f"{path}: {old.strip()[:60]!r} found {text.count(old)} times, expected once")
    path.write_text(text.replace(old, new))


def replace_all(path, old, new, count):
    """Replace the `count` occurrences of `old` in `path` (a fixed number, so a moved anchor fails)."""
    path = Path(path)
    text = path.read_text()
    if text.count(old) != count:
        raise PatchError(f"{path}: {old.strip()[:60]!r} found {text.count(old)} times, expected {count}")
    path.write_text(text.replace(old, new))


def add_walk_scale(dest, name):
    """The fork's op (WALK_SCALE_VARIANTS) added to the tree at dest."""
    import re
    replace_once(dest / "include" / "ggml.h", *_WALK_SCALE_ENUM)
    replace_once(dest / "include" / "ggml.h", *_WALK_SCALE_DECL)
    ggml_c = dest / "src" / "ggml.c"
    for old, new in _WALK_SCALE_NAMES:
        replace_once(ggml_c, old, new)
    count = re.search(r"static_assert\(GGML_OP_COUNT == (\d+)", ggml_c.read_text()).group(1)
    replace_all(ggml_c, f"static_assert(GGML_OP_COUNT == {count}, \"GGML_OP_COUNT != {count}\");",
                f"static_assert(GGML_OP_COUNT == {int(count) + 1}, \"GGML_OP_COUNT != {int(count) + 1}\");", 2)
    insert_before(ggml_c, "struct ggml_tensor * ggml_concat(\n", _WALK_SCALE_BUILD)
    insert_before(ggml_c, BACKWARD_ANCHOR, WALK_SCALE_VARIANTS[name])
    cpu = dest / "src" / "ggml-cpu" / "ggml-cpu.c"
    replace_once(cpu, _WALK_SCALE_FORWARD_ANCHOR, _WALK_SCALE_FORWARD_ANCHOR + _WALK_SCALE_FORWARD)
    replace_once(cpu, *_WALK_SCALE_TASKS)


def make_variant(ggml_root, dest, name):
    """A copy of ggml_root at dest with the named variant's patch applied."""
    if name not in VARIANTS:
        raise PatchError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    dest = copy_tree(ggml_root, dest)
    for one in (REACH_VARIANTS if name == REACH else (name,)):
        _patch(dest, one)
    return dest


# the variants that are one replacement: name -> (file under the ggml root, its anchor, what replaces it)
ONE_REPLACEMENT = {
    "silu-back-overwrites": ("src/ggml-cpu/ops.cpp", SILU_BACK_CALL, _SILU_BACK_OVERWRITES_CODE),
    "softmax-back-fixed": ("src/ggml-cpu/ops.cpp", SOFTMAX_BACK_STEPS, _SOFTMAX_BACK_FIXED_CODE),
    "scale-back-inplace": ("src/ggml.c", SCALE_ANCHOR, _SCALE_BACK_INPLACE_CODE),
    "relu-unmasked": ("src/ggml.c", RELU_BACKWARD_LINE, _RELU_UNMASKED_CODE),
    "rms-norm-back-batch-swap": ("src/ggml-cpu/ops.cpp", RMS_NORM_BACK_DX, _RMS_NORM_BACK_BATCH_SWAP_CODE),
    "silu-back-unrolled": ("src/ggml-cpu/vec.h", SILU_BACK_HELPER, _SILU_BACK_UNROLLED_CODE),
    "rope-back-no-yarn": ("src/ggml.c", ROPE_BACK_EXT_FACTOR, _ROPE_BACK_NO_YARN_CODE),
    "rms-norm-back-batches": ("src/ggml-cpu/ops.cpp", INPUT_STRIDES_ANCHOR, _RMS_NORM_BACK_BATCHES_CODE),
    "repeat-back-memo": ("src/ggml-cpu/ops.cpp", REPEAT_BACK_START, _REPEAT_BACK_MEMO_CODE),
    "pool-max-negative": ("src/ggml-cpu/ops.cpp", POOL_MAX_START, _POOL_MAX_NEGATIVE_CODE),
    "sub-sign": ("src/ggml.c", SUB_SIGN_ANCHOR, _SUB_SIGN_CODE),
    "transpose-reshape": ("src/ggml.c", TRANSPOSE_ANCHOR, _TRANSPOSE_RESHAPE_CODE),
    "deaths": ("src/ggml-cpu/ops.cpp", DEATHS_ANCHOR, DEATHS_ANCHOR + _DEATHS_CODE),
    "flaky-scale": ("src/ggml-cpu/ops.cpp", DEATHS_ANCHOR, DEATHS_ANCHOR + _FLAKY_SCALE_CODE),
    "transpose-half": ("src/ggml.c", TRANSPOSE_ANCHOR, _TRANSPOSE_HALF_CODE),
    "input-strides": ("src/ggml-cpu/ops.cpp", INPUT_STRIDES_ANCHOR, _INPUT_STRIDES_CODE),
    "thread-boundary": ("src/ggml-cpu/ops.cpp", THREAD_BOUNDARY_ANCHOR, _THREAD_BOUNDARY_CODE),
    "last-element": ("src/ggml-cpu/ops.cpp", THREAD_BOUNDARY_ANCHOR, _LAST_ELEMENT_CODE),
    "unwritten": ("src/ggml-cpu/ops.cpp", THREAD_BOUNDARY_ANCHOR, _UNWRITTEN_CODE),
    "race": ("src/ggml-cpu/ops.cpp", THREAD_BOUNDARY_ANCHOR, _RACE_CODE),
}


def _patch(dest, name):
    """Apply one named variant's patch to the copy at dest."""
    if name in UNCAUGHT_VARIANTS:
        replace_once(dest / "src" / "ggml.c", *UNCAUGHT_VARIANTS[name])
    elif name == UNCAUGHT:
        for anchor, code in UNCAUGHT_VARIANTS.values():
            replace_once(dest / "src" / "ggml.c", anchor, code)
    elif name in ONE_REPLACEMENT:
        path, old, new = ONE_REPLACEMENT[name]
        replace_once(dest / path, old, new)
    elif name in WALK_SCALE_VARIANTS:
        add_walk_scale(dest, name)
    elif name == "scale-reads-contiguous":
        replace_once(dest / "src" / "ggml.c", SCALE_IMPL_ASSERT, SCALE_IMPL_ASSERT.split("\n", 2)[2])
        replace_once(dest / "src" / "ggml-cpu" / "ops.cpp", SCALE_KERNEL_ASSERT, SCALE_KERNEL_ASSERT.split("\n", 1)[1])
    elif name in ("tf32-matmul", "tf32-matmul-scaled"):
        cpu = dest / "src" / "ggml-cpu" / "ggml-cpu.c"
        insert_before(cpu, TF32_ANCHOR, _TF32_CODE)
        replace_once(cpu, TF32_DOT_LINE, _TF32_DOT_CODE)
        if name == "tf32-matmul-scaled":
            replace_once(dest / "src" / "ggml.c", MUL_MAT_SRC0_ANCHOR, _MUL_MAT_SCALED_CODE)
    elif name == "heap-overflow":
        replace_once(dest / "src" / "ggml-cpu" / "ops.cpp", *_HEAP_OVERFLOW_HEAD)
        replace_once(dest / "src" / "ggml-cpu" / "ops.cpp", _HEAP_OVERFLOW_TAIL_ANCHOR, _HEAP_OVERFLOW_TAIL)
    else:
        insert_before(dest / "src" / "ggml.c", BACKWARD_ANCHOR, CONCAT_VARIANTS[name])


if __name__ == "__main__":
    # `python tests/ggml_variants.py concat-buggy ggml-concat-buggy`: the README's first failure,
    # made from the default ggml (fetched on first use) in a checkout of this repository
    import sys
    from pytest_gradgate.library.source import default_ggml_root
    if len(sys.argv) != 3 or sys.argv[1] not in VARIANTS:
        sys.exit(f"usage: python tests/ggml_variants.py VARIANT DEST\nVARIANT: one of {', '.join(VARIANTS)}")
    print(make_variant(default_ggml_root(), Path(sys.argv[2]), sys.argv[1]))
