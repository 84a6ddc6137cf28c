#include "qwen3-graph.h"

#include "graph.h"

#include <cmath>

namespace aural {

namespace {

ggml_tensor * input(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, const char * name) {
    ggml_tensor * t = ne1 > 0 ? ggml_new_tensor_2d(ctx, type, ne0, ne1) : ggml_new_tensor_1d(ctx, type, ne0);
    ggml_set_name(t, name);
    ggml_set_input(t);
    return t;
}

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

ggml_tensor * linear(ggml_context * ctx, const qwen3_linear & l, ggml_tensor * x) {
    x = ggml_mul_mat(ctx, l.w, x);
    return l.b ? ggml_add(ctx, x, l.b) : x;
}

// RoPE in rotate_half's layout (the pairs (i, i + hd/2); ggml's NEOX), by a table: x [hd, n_heads, n],
// cos and sin [hd/2, n] of each token's angles. ggml_rope_ext forms the angles on the fly, pos * theta^(-2i/hd)
// by i successive f32 products, whose rounding grows with i and with the position (6e-4 rad at position 157,
// head_dim 128): Aural's logits then strayed 10x further from a float64 run than the reference's own f32 did.
// The table is made in double and rounded once (qwen3-context.cpp).
void rope_table_op(ggml_tensor * dst, const ggml_tensor * x, const ggml_tensor * cos, const ggml_tensor * sin, int ith,
                   int nth, void * /*userdata*/) {
    const int64_t hd = x->ne[0], half = hd / 2, n_heads = x->ne[1], rows = n_heads * x->ne[2];
    for (int64_t r = ith; r < rows; r += nth) {
        const int64_t t = r / n_heads;
        const float * c = static_cast<const float *>(cos->data) + t * half;
        const float * s = static_cast<const float *>(sin->data) + t * half;
        const float * in = static_cast<const float *>(x->data) + r * hd;
        float * out = static_cast<float *>(dst->data) + r * hd;
        for (int64_t i = 0; i < half; ++i) {  // x cos + rotate_half(x) sin (modeling_qwen3_asr.apply_rotary_pos_emb)
            out[i] = in[i] * c[i] - in[i + half] * s[i];
            out[i + half] = in[i + half] * c[i] + in[i] * s[i];
        }
    }
}

// rope_table_op in ggml's ops, for devices: x [hd, n_heads, n], cos and sin [hd/2, n] broadcast over the heads.
ggml_tensor * rope_table(ggml_context * ctx, ggml_tensor * x, ggml_tensor * cos, ggml_tensor * sin) {
    const int64_t half = x->ne[0] / 2;
    ggml_tensor * x1 = ggml_view_3d(ctx, x, half, x->ne[1], x->ne[2], x->nb[1], x->nb[2], 0);
    ggml_tensor * x2 = ggml_view_3d(ctx, x, half, x->ne[1], x->ne[2], x->nb[1], x->nb[2], half * x->nb[0]);
    cos = ggml_reshape_3d(ctx, cos, half, 1, cos->ne[1]);
    sin = ggml_reshape_3d(ctx, sin, half, 1, sin->ne[1]);
    ggml_tensor * lo = ggml_sub(ctx, ggml_mul(ctx, x1, cos), ggml_mul(ctx, x2, sin));
    ggml_tensor * hi = ggml_add(ctx, ggml_mul(ctx, x2, cos), ggml_mul(ctx, x1, sin));
    return ggml_concat(ctx, lo, hi, 0);
}

// x [n_state, n] -> q, k or v heads [head_dim, n_heads, n], normed over head_dim and rotated where asked.
ggml_tensor * heads(ggml_context * ctx, const qwen3_model & m, ggml_tensor * x, const qwen3_linear & proj,
                    const qwen3_norm * norm, const qwen3_decoder_graph & g) {
    const auto & tx = m.hp.text;
    ggml_tensor * h = linear(ctx, proj, x);
    h = ggml_reshape_3d(ctx, h, tx.head_dim, h->ne[0] / tx.head_dim, x->ne[1]);
    if (!norm) return h;
    h = rms_norm(ctx, h, norm->w, tx.norm_eps);
    return m.rope_op ? ggml_map_custom3(ctx, h, g.rope_cos, g.rope_sin, rope_table_op, GGML_N_TASKS_MAX, nullptr)
                     : rope_table(ctx, h, g.rope_cos, g.rope_sin);
}

}  // namespace

// Qwen3 layers make about 40 nodes and views each (RoPE by ggml's ops: 2 x 10 more), and each part about 12 more
// (its columns, K/V writes, arena views, attention, the join); the embeddings, the norm and the output a handful,
// and each part's last row 2.
size_t qwen3_graph_size(const qwen3_model & m, size_t n_parts) {
    return 64 + 4 * n_parts + (72 + 16 * n_parts) * m.hp.text.n_layer;
}

void qwen3_rope_table(const qwen3_model & m, const int32_t * pos, int64_t n, float * cos, float * sin) {
    const int64_t hd = m.hp.text.head_dim, half = hd / 2;
    for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < half; ++i) {
            const double angle = pos[t] * std::pow(static_cast<double>(m.hp.text.rope_theta), -2.0 * i / hd);
            cos[t * half + i] = static_cast<float>(std::cos(angle));
            sin[t * half + i] = static_cast<float>(std::sin(angle));
        }
    }
}

qwen3_decoder_graph build_qwen3_decoder(const qwen3_model & m, const std::vector<qwen3_part> & parts, int64_t n_audio,
                                        bool all_logits) {
    const auto & tx = m.hp.text;
    const size_t n_nodes = qwen3_graph_size(m, parts.size());
    ggml_init_params params = {/*.mem_size =*/ ggml_tensor_overhead() * n_nodes + ggml_graph_overhead_custom(n_nodes, false),
                               /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true};
    qwen3_decoder_graph g;
    g.ctx = ggml_init(params);
    ggml_context * ctx = g.ctx;
    g.gf = ggml_new_graph_custom(ctx, n_nodes, false);
    int64_t n_tokens = 0;
    for (const qwen3_part & p : parts) {
        g.cells.push_back(input(ctx, GGML_TYPE_I64, p.n_tokens, 0, "kv_cells"));
        g.mask.push_back(input(ctx, GGML_TYPE_F16, p.kv->n_ctx(), p.n_tokens, "kq_mask"));
        n_tokens += p.n_tokens;
    }
    g.tokens = input(ctx, GGML_TYPE_I32, n_tokens, 0, "tokens");
    g.rope_cos = input(ctx, GGML_TYPE_F32, m.hp.text.head_dim / 2, n_tokens, "rope_cos");
    g.rope_sin = input(ctx, GGML_TYPE_F32, m.hp.text.head_dim / 2, n_tokens, "rope_sin");

    ggml_tensor * x = ggml_get_rows(ctx, m.embed_tokens, g.tokens);  // [n_state, n_tokens]
    if (n_audio > 0) {  // the audio tokens' rows become the audio tower's output (inputs_embeds.masked_scatter)
        // As a gather from [token embeddings, audio vectors] rather than ggml_set_rows into the embeddings: that
        // writes in place, and a device then wrote into the CPU's memory where the embedding table stays on the
        // CPU (Qwen3-ASR-0.6B's on llvmpipe: SIGBUS in ggml-vulkan). The same copies, so the same values.
        g.audio = input(ctx, GGML_TYPE_F32, tx.n_state, n_audio, "audio");
        g.embed_order = input(ctx, GGML_TYPE_I32, n_tokens, 0, "embed_order");
        x = ggml_get_rows(ctx, ggml_concat(ctx, x, g.audio, 1), g.embed_order);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(tx.head_dim));
    const int64_t n_kv_state = static_cast<int64_t>(tx.n_head_kv) * tx.head_dim;
    const int64_t n_q_state = static_cast<int64_t>(tx.n_head) * tx.head_dim;
    for (size_t il = 0; il < m.text_layers.size(); ++il) {
        const qwen3_text_layer & l = m.text_layers[il];
        ggml_tensor * cur = rms_norm(ctx, x, l.attn_norm.w, tx.norm_eps);
        // [hd * n_head, n]: a part's columns are its queries (heads() makes q contiguous)
        ggml_tensor * q = ggml_reshape_2d(ctx, heads(ctx, m, cur, l.q, &l.q_norm, g), n_q_state, n_tokens);
        ggml_tensor * k = ggml_reshape_2d(ctx, heads(ctx, m, cur, l.k, &l.k_norm, g), n_kv_state, n_tokens);
        ggml_tensor * v = ggml_reshape_2d(ctx, heads(ctx, m, cur, l.v, nullptr, g), n_kv_state, n_tokens);
        std::vector<ggml_tensor *> attn;
        int64_t begin = 0;
        for (size_t ip = 0; ip < parts.size(); ++ip) {
            const qwen3_part & p = parts[ip];
            // Write this part's K/V rows into its arena in place before its attention reads it (graph order).
            ggml_build_forward_expand(g.gf, p.kv->cpy_k(ctx, columns(ctx, k, begin, p.n_tokens), g.cells[ip], il));
            ggml_build_forward_expand(g.gf, p.kv->cpy_v(ctx, columns(ctx, v, begin, p.n_tokens), g.cells[ip], il));
            ggml_tensor * qp = ggml_reshape_3d(ctx, columns(ctx, q, begin, p.n_tokens), tx.head_dim, tx.n_head, p.n_tokens);
            qp = ggml_permute(ctx, qp, 0, 2, 1, 3);
            ggml_tensor * a = ggml_flash_attn_ext(ctx, qp, p.kv->get_k(ctx, il), p.kv->get_v(ctx, il), g.mask[ip], scale,
                                                  0.0f, 0.0f);
            ggml_flash_attn_ext_set_prec(a, GGML_PREC_F32);
            attn.push_back(ggml_reshape_2d(ctx, a, n_q_state, p.n_tokens));
            begin += p.n_tokens;
        }
        x = ggml_add(ctx, x, linear(ctx, l.o, join(ctx, attn)));

        cur = rms_norm(ctx, x, l.ffn_norm.w, tx.norm_eps);
        ggml_tensor * gate = ggml_silu(ctx, linear(ctx, l.gate, cur));
        x = ggml_add(ctx, x, linear(ctx, l.down, ggml_mul(ctx, gate, linear(ctx, l.up, cur))));
    }
    if (!all_logits) {  // each part's last token
        std::vector<ggml_tensor *> last;
        int64_t end = 0;
        for (const qwen3_part & p : parts) {
            end += p.n_tokens;
            last.push_back(columns(ctx, x, end - 1, 1));
        }
        x = join(ctx, last);
    }
    x = rms_norm(ctx, x, m.norm.w, tx.norm_eps);
    g.logits = ggml_mul_mat(ctx, m.lm_head, x);
    ggml_set_name(g.logits, "logits");
    ggml_set_output(g.logits);
    ggml_build_forward_expand(g.gf, g.logits);
    return g;
}

}  // namespace aural
