#include "graph.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "activation.h"
#include "attention.h"
#include "int8-matmul.h"
#include "transpose.h"
#include "ggml-backend.h"

namespace aural {

namespace {

// ---- inputs -------------------------------------------------------------------------------------

// A 1-D input whose length is the batch's token count.
class tokens_input : public graph_input {
  public:
    explicit tokens_input(ggml_tensor * t) : t_(t) {}
    void set_input(const decode_batch & b) override {
        ggml_backend_tensor_set(t_, b.tokens, 0, b.n_tokens * sizeof(int32_t));
    }
    bool can_reuse(const decode_params & p) const override { return t_->ne[0] == p.n_tokens; }

  private:
    ggml_tensor * t_;
};

// The part `j` of a step's params (the whole step when it has no parts).
decode_part part_of(const decode_params & p, size_t j) {
    return p.parts.empty() ? decode_part{nullptr, 0, p.n_tokens, p.n_cross} : p.parts[j];
}

// Positions (i32, for the positional embedding) of every token of the step.
class positions_input : public graph_input {
  public:
    explicit positions_input(ggml_tensor * pos) : pos_(pos) {}
    void set_input(const decode_batch & b) override {
        ggml_backend_tensor_set(pos_, b.pos.data(), 0, ggml_nbytes(pos_));
    }
    bool can_reuse(const decode_params & p) const override { return pos_->ne[0] == p.n_tokens; }

  private:
    ggml_tensor * pos_;
};

// Arena cells (i64, for ggml_set_rows) of part j's tokens.
class cells_input : public graph_input {
  public:
    cells_input(ggml_tensor * cells, size_t j) : cells_(cells), j_(j) {}
    void set_input(const decode_batch & b) override {
        ggml_backend_tensor_set(cells_, b.part(j_).cells.data(), 0, ggml_nbytes(cells_));
    }
    bool can_reuse(const decode_params & p) const override { return cells_->ne[0] == part_of(p, j_).n_tokens; }

  private:
    ggml_tensor * cells_;
    size_t j_;
};

// Mask over part j's whole arena: f16 [n_kv, n_tokens]; token i sees the cells of its own sequence at
// positions up to its own (causal), whatever their order in the arena.
class mask_input : public graph_input {
  public:
    mask_input(ggml_tensor * t, size_t j) : t_(t), j_(j) {}
    void set_input(const decode_batch & b) override {
        const decode_batch & part = b.part(j_);
        std::vector<ggml_fp16_t> mask(ggml_nelements(t_));
        part.kv->mask(part.seq.data(), part.pos.data(), part.n_tokens, mask.data());
        ggml_backend_tensor_set(t_, mask.data(), 0, ggml_nbytes(t_));
    }
    bool can_reuse(const decode_params & p) const override { return t_->ne[1] == part_of(p, j_).n_tokens; }

  private:
    ggml_tensor * t_;
    size_t j_;
};

// A paged arena's K/V row of every cell (i32 [n_ctx], kv_cache::rows): the block table of this step.
class rows_input : public graph_input {
  public:
    rows_input(ggml_tensor * t, const kv_cache * kv) : t_(t), kv_(kv), rows_(static_cast<size_t>(t->ne[0])) {}
    void set_input(const decode_batch &) override {
        kv_->rows(rows_.data());
        ggml_backend_tensor_set(t_, rows_.data(), 0, ggml_nbytes(t_));
    }
    bool can_reuse(const decode_params &) const override { return true; }  // one arena's, fixed length

  private:
    ggml_tensor * t_;
    const kv_cache * kv_;
    std::vector<int32_t> rows_;
};

// Which batch rows reach the vocabulary projection (usually the last; the SOT row for no-speech).
class outputs_input : public graph_input {
  public:
    explicit outputs_input(ggml_tensor * t) : t_(t) {}
    void set_input(const decode_batch & b) override {
        ggml_backend_tensor_set(t_, b.outputs.data(), 0, ggml_nbytes(t_));
    }
    bool can_reuse(const decode_params & p) const override { return t_->ne[0] == p.n_outputs; }

  private:
    ggml_tensor * t_;
};

// ---- layers -------------------------------------------------------------------------------------

ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, const norm_weights & w) {
    x = ggml_norm(ctx, x, hparams::norm_eps);
    return ggml_add(ctx, ggml_mul(ctx, x, w.w), w.b);
}

// residual + (w x + b) (either may be null), by w's int8 copy where the model has one (int8-matmul.h): then
// the bias and the residual are added in the product's node, the same sums as ggml_add nodes after it.
ggml_tensor * linear(ggml_context * ctx, const model & m, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b,
                     ggml_tensor * residual = nullptr) {
    ggml_tensor * w8 = m.int8_of(w);
    const bool fuse = w8 && (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b))) &&
                      (!residual || (residual->type == GGML_TYPE_F32 && ggml_is_contiguous(residual)));
    if (fuse) {
        return int8_matmul(ctx, w8, w->ne[1], x, {b, residual});
    }
    x = w8 ? int8_matmul(ctx, w8, w->ne[1], x) : ggml_mul_mat(ctx, w, x);
    x = b ? ggml_add(ctx, x, b) : x;
    return residual ? ggml_add(ctx, residual, x) : x;
}

// w_i x + b_i for projections of one input x [n_in, n], each [n_out, n] (contiguous): by one int8 product
// where the model packed them as a group (model.h, int8_group), else one linear each.
std::vector<ggml_tensor *> linears(ggml_context * ctx, const model & m, ggml_tensor * x,
                                   const std::vector<ggml_tensor *> & ws, const std::vector<ggml_tensor *> & bs) {
    std::vector<ggml_tensor *> out;
    if (const model::int8_group * g = m.int8_group_of(ws)) {
        ggml_tensor * y = int8_matmul(ctx, g->w, g->n_split * g->rows_each, x, {g->bias, nullptr, g->n_split});
        for (int64_t i = 0; i < g->n_split; ++i) {  // y [rows_each, n, n_split]
            out.push_back(ggml_view_2d(ctx, y, y->ne[0], y->ne[1], y->nb[1], i * y->nb[2]));
        }
        return out;
    }
    for (size_t i = 0; i < ws.size(); ++i) {
        out.push_back(linear(ctx, m, x, ws[i], bs[i]));
    }
    return out;
}

// A layer's self-attention q, k and v of x.
std::vector<ggml_tensor *> qkv(ggml_context * ctx, const model & m, ggml_tensor * x, const attn_weights & w) {
    return linears(ctx, m, x, {w.q_w, w.k_w, w.v_w}, {w.q_b, nullptr, w.v_b});
}

// [n_state, n] -> [head_dim, n, n_head], the layout ggml_flash_attn_ext takes for q, k and v.
ggml_tensor * split_heads(ggml_context * ctx, ggml_tensor * x, int n_head) {
    x = ggml_reshape_3d(ctx, x, x->ne[0] / n_head, n_head, x->ne[1]);
    return ggml_permute(ctx, x, 0, 2, 1, 3);
}

// softmax(q k^T / sqrt(head_dim) + mask) v; result [n_state, n_q]. Whisper scales q and k each by
// head_dim^-0.25 (ref: openai-whisper model.py MultiHeadAttention.qkv_attention): the same product.
ggml_tensor * attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * mask,
                        int n_head) {
    const int64_t n_state = q->ne[0], n_q = q->ne[1];
    const float scale = 1.0f / std::sqrt(static_cast<float>(n_state / n_head));
    ggml_tensor * out = ggml_flash_attn_ext(ctx, split_heads(ctx, q, n_head), k, v, mask, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);  // f32 accumulation on GPUs, as on the CPU
    return ggml_reshape_2d(ctx, out, n_state, n_q);     // out is [head_dim, n_head, n_q], contiguous
}

// Encoder self-attention K or V, [n_state, n] -> [head_dim, n, n_head]. Flash attention on GPUs takes f16
// (or quantised) K/V. ggml-cpu's tiled flash attention converts f16 K/V back to f32 for every 64-query tile
// (24 times per head at 1500 positions), so on the CPU the f32 projection is passed as a view: no cast, no copy.
ggml_tensor * attention_kv(ggml_context * ctx, ggml_tensor * x, int n_head, bool f16) {
    x = split_heads(ctx, x, n_head);
    return f16 ? ggml_cast(ctx, x, GGML_TYPE_F16) : x;
}

// x [a, b] f32 -> x^T [b, a] f32, contiguous: by Aural's op on the CPU (transpose.h: ggml-cpu copies a
// transposed view one element at a time, by a libc call each), else by ggml's copy.
ggml_tensor * transposed(ggml_context * ctx, const model & m, ggml_tensor * x) {
    return m.simd_transpose ? transpose(ctx, x, GGML_TYPE_F32) : ggml_cont(ctx, ggml_transpose(ctx, x));
}

// A window's cross V [n_state, n_ctx] f32 into the arena, which holds V^T: transposed and rounded to the arena's
// type by one op on the CPU, then copied as it is.
ggml_tensor * cross_v_into(ggml_context * ctx, const model & m, const kv_cache & kv, ggml_tensor * v, int il) {
    if (m.simd_transpose && (kv.type() == GGML_TYPE_F16 || kv.type() == GGML_TYPE_F32)) {
        return kv.cpy_cross_v(ctx, transpose(ctx, v, kv.type()), il, true);
    }
    return kv.cpy_cross_v(ctx, v, il);
}

// Encoder self-attention of x [n_state, n] before the output projection, by flash attention (any backend).
ggml_tensor * encoder_attention(ggml_context * ctx, const model & m, ggml_tensor * x, const attn_weights & w,
                                int n_head, bool kv_f16) {
    const std::vector<ggml_tensor *> p = qkv(ctx, m, x, w);
    return attention(ctx, p[0], attention_kv(ctx, p[1], n_head, kv_f16), attention_kv(ctx, p[2], n_head, kv_f16),
                     nullptr, n_head);
}

// The same by Aural's CPU op (attention.h), which takes K transposed. With plain f32 weights (widened for
// the CPU) swapping the projection's operands gives kt [n, n_state] = (w_k x)^T at no extra cost; ggml-cpu's
// mul_mat takes its second operand only as f32, so other weights (int8 copies, q8_0, models too large to
// widen) project K as usual and transpose it with a copy (n x n_state floats; see transposed()).
ggml_tensor * encoder_attention_cpu(ggml_context * ctx, const model & m, ggml_tensor * x, const attn_weights & w,
                                    int n_head) {
    if (w.k_w->type == GGML_TYPE_F32 && !m.int8_of(w.k_w)) {
        return encoder_self_attention(ctx, linear(ctx, m, x, w.q_w, w.q_b), ggml_mul_mat(ctx, x, w.k_w),
                                      linear(ctx, m, x, w.v_w, w.v_b), n_head);
    }
    const std::vector<ggml_tensor *> p = qkv(ctx, m, x, w);
    return encoder_self_attention(ctx, p[0], transposed(ctx, m, p[1]), p[2], n_head);
}

// residual + mlp(x).
ggml_tensor * mlp(ggml_context * ctx, const model & m, ggml_tensor * x, const mlp_weights & w, ggml_tensor * residual) {
    // Whisper's MLP uses the exact (erf) GELU. ggml_gelu (tanh form, f16 table, as whisper.cpp uses) made
    // beam 5 lose a word on the dev clips (bench/results/speed-ablation.md), so the exact form stays.
    x = gelu_erf(ctx, linear(ctx, m, x, w.fc1_w, w.fc1_b), m.simd_gelu);
    return linear(ctx, m, x, w.fc2_w, w.fc2_b, residual);
}

// Names `t`, marks it as an output (its memory outlives the graph's other intermediates) and adds it to `gf`.
ggml_tensor * graph_output(ggml_cgraph * gf, ggml_tensor * t, const char * name) {
    ggml_set_name(t, name);
    ggml_set_output(t);
    ggml_build_forward_expand(gf, t);
    return t;
}

// Conv1d bias [n_state] broadcast over time: the conv output is [n_time, n_state].
ggml_tensor * conv_bias(ggml_context * ctx, ggml_tensor * x, ggml_tensor * b) {
    return ggml_add(ctx, x, ggml_reshape_2d(ctx, b, 1, b->ne[0]));
}

}  // namespace

// ---- graph_result ---------------------------------------------------------------------------------

graph_result::graph_result(size_t max_nodes) {
    ggml_init_params params = {
        /*.mem_size =*/ ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc =*/ true,
    };
    ctx = ggml_init(params);
    gf = ggml_new_graph_custom(ctx, max_nodes, false);
}

graph_result::~graph_result() { ggml_free(ctx); }

bool graph_result::can_reuse(const decode_params & p) const {
    if (!(p == params) || inputs.empty()) {
        return false;
    }
    for (const auto & in : inputs) {
        if (!in->can_reuse(p)) {
            return false;
        }
    }
    return true;
}

void graph_result::read_logits(float * out) const {
    ggml_backend_tensor_get(logits, out, 0, ggml_nbytes(logits));
    if (!top) {
        return;
    }
    const int64_t k = top->ne[0], n_outputs = top->ne[1], n_vocab = logits->ne[0];
    std::vector<int32_t> ids(static_cast<size_t>(k * n_outputs));
    std::vector<float> values(ids.size());
    ggml_backend_tensor_get(top, ids.data(), 0, ggml_nbytes(top));
    ggml_backend_tensor_get(exact, values.data(), 0, ggml_nbytes(exact));
    for (int64_t o = 0; o < n_outputs; ++o) {
        for (int64_t i = 0; i < k; ++i) {
            out[o * n_vocab + ids[o * k + i]] = values[o * k + i];
        }
    }
}

void graph_result::set_inputs(const decode_batch & batch) {
    for (auto & in : inputs) {
        in->set_input(batch);
    }
}

// ---- builders -------------------------------------------------------------------------------------

std::unique_ptr<graph_result> build_encoder(const model & m, const kv_cache & kv, uint32_t n_ctx) {
    const hparams & hp = m.hp;
    auto res = std::make_unique<graph_result>(max_graph_nodes);
    res->n_audio_ctx = n_ctx;
    ggml_context * ctx = res->ctx;

    res->mel = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2 * n_ctx, hp.n_mels);
    ggml_set_name(res->mel, "mel");
    ggml_set_input(res->mel);

    // conv stem: [2n, n_mels] -> [2n, n_state] -> (stride 2) [n, n_state]
    ggml_tensor * x = gelu_erf(ctx, conv_bias(ctx, ggml_conv_1d_ph(ctx, m.conv1_w, res->mel, 1, 1), m.conv1_b),
                               m.simd_gelu);
    x = gelu_erf(ctx, conv_bias(ctx, ggml_conv_1d_ph(ctx, m.conv2_w, x, 2, 1), m.conv2_b), m.simd_gelu);
    ggml_tensor * pos = ggml_view_2d(ctx, m.enc_pos, m.enc_pos->ne[0], n_ctx, m.enc_pos->nb[1], 0);
    x = ggml_add(ctx, transposed(ctx, m, x), pos);  // [n_state, n_ctx]

    const int n_head = static_cast<int>(hp.n_audio_head);
    const bool kv_f16 = !m.on_cpu();
    for (const encoder_layer & l : m.enc) {
        ggml_tensor * cur = layer_norm(ctx, x, l.attn_ln);
        cur = m.simd_attention ? encoder_attention_cpu(ctx, m, cur, l.attn, n_head)
                               : encoder_attention(ctx, m, cur, l.attn, n_head, kv_f16);
        x = linear(ctx, m, cur, l.attn.o_w, l.attn.o_b, x);
        x = mlp(ctx, m, layer_norm(ctx, x, l.mlp_ln), l.mlp, x);
    }
    x = layer_norm(ctx, x, m.enc_ln_post);

    // Cross-attention K/V of every decoder layer, computed once per window and kept in the arena.
    std::vector<ggml_tensor *> ws, bs;
    for (const decoder_layer & l : m.dec) {
        ws.insert(ws.end(), {l.cross.k_w, l.cross.v_w});
        bs.insert(bs.end(), {nullptr, l.cross.v_b});
    }
    const std::vector<ggml_tensor *> cross = linears(ctx, m, x, ws, bs);
    for (size_t il = 0; il < m.dec.size(); ++il) {
        ggml_build_forward_expand(res->gf, kv.cpy_cross_k(ctx, cross[2 * il], il));
        ggml_build_forward_expand(res->gf, cross_v_into(ctx, m, kv, cross[2 * il + 1], il));
    }
    return res;
}

// Cross-attention of the decoder tokens over the window's audio positions, as two matrix products:
// q [n_state, n_tokens], k [head_dim, n_cross, n_head], vt [n_cross, head_dim, n_head] -> [n_state, n_tokens],
// and the softmaxed weights [n_cross, n_tokens, n_head] in *weights. Unlike flash attention, which walks
// the audio positions one at a time with an online softmax for every query row, this reads K and V^T once per
// step for every token of the batch (beams) and sums over positions with long dot products: on the CPU a
// decoder call takes 0.95x (greedy) and 0.92x (beam 5) the time at 1500 positions (bench/results/decoder-ab.md).
// The weights it materialises also give the alignment heads.
ggml_tensor * cross_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * vt, int n_head,
                              ggml_tensor ** weights) {
    const int64_t n_state = q->ne[0], n_tokens = q->ne[1];
    const float scale = 1.0f / std::sqrt(static_cast<float>(n_state / n_head));
    ggml_tensor * kq = ggml_mul_mat(ctx, k, split_heads(ctx, q, n_head));  // [n_cross, n_tokens, n_head]
    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(ctx, kq, nullptr, scale, 0.0f);
    *weights = kq;
    ggml_tensor * kqv = ggml_mul_mat(ctx, vt, kq);  // [head_dim, n_tokens, n_head]
    ggml_mul_mat_set_prec(kqv, GGML_PREC_F32);
    return ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3)), n_state, n_tokens);
}

// How many of the screen's best tokens per output are rescored with tok_emb. Greedy search takes the best,
// beam search the best beam_size + 1 per beam (ref: openai-whisper decoding.py BeamSearchDecoder). Over 106
// greedy steps of JFK and the sonnet (tiny.en) q8_0 moved a logit by at most 0.44, while the screen's 32nd
// best lay 4.7 to 10 below its best: the true best few are among the 32, and every token left with its
// q8_0 logit has under 1 % of the best one's probability. The int8 screen moves a logit by up to 1.0 (first
// steps of JFK and the sonnet): the best few are still among the 32, and a tail token's logit may be 1.0 off.
constexpr int screen_top_k = 32;

// The tied output projection x [n_state, n_outputs] -> logits [n_vocab, n_outputs] in res.logits. With a
// screen (model.h), every logit comes from its int8 or q8_0 copy and the screen's best screen_top_k per
// output are recomputed from tok_emb (f32 rows x f32 x) into res.top / res.exact, which read_logits writes
// over them: the choices and the probability mass they carry are exact, the tail is the copy's.
void output_logits(ggml_context * ctx, const model & m, ggml_tensor * x, graph_result & res) {
    if (!m.out_screen) {
        res.logits = graph_output(res.gf, ggml_mul_mat(ctx, m.tok_emb, x), "logits");
        return;
    }
    const int64_t n_state = x->ne[0], n_outputs = x->ne[1];
    ggml_tensor * screened = m.out_screen->type == GGML_TYPE_I8 ? int8_matmul(ctx, m.out_screen, m.tok_emb->ne[1], x)
                                                                : ggml_mul_mat(ctx, m.out_screen, x);
    res.logits = graph_output(res.gf, screened, "logits");
    res.top = graph_output(res.gf, ggml_top_k(ctx, res.logits, screen_top_k), "screen_top");
    // get_rows takes one index list per tok_emb matrix: gather all outputs' rows, then split per output.
    ggml_tensor * rows = ggml_get_rows(ctx, m.tok_emb, ggml_reshape_1d(ctx, res.top, screen_top_k * n_outputs));
    rows = ggml_reshape_3d(ctx, rows, n_state, screen_top_k, n_outputs);
    res.exact = graph_output(res.gf, ggml_mul_mat(ctx, rows, ggml_reshape_3d(ctx, x, n_state, 1, n_outputs)),
                             "screen_exact");
}

// The given heads of softmaxed cross-attention weights [n_cross, n_tokens, n_head] -> [n_cross, n_tokens, heads].
ggml_tensor * select_heads(ggml_context * ctx, ggml_tensor * kq, const std::vector<int> & heads) {
    ggml_tensor * out = nullptr;
    for (int h : heads) {
        ggml_tensor * w = ggml_view_3d(ctx, kq, kq->ne[0], kq->ne[1], 1, kq->nb[1], kq->nb[2], h * kq->nb[2]);
        out = out ? ggml_concat(ctx, out, w, 2) : ggml_cont(ctx, w);
    }
    return out;
}

// Steps of up to this many tokens (a beam per row) take Aural's self-attention op; prompts keep ggml's flash
// attention, whose tiles share each K/V row among many query rows: a 225-token prompt took 86 ms with the op
// against 70 ms (tiny.en, Zen 2), while a greedy step went from 3.35 to 2.90 ms with it.
constexpr int64_t self_attention_max_rows = 8;

ggml_tensor * columns(ggml_context * ctx, ggml_tensor * x, int64_t begin, int64_t n) {
    return begin == 0 && n == x->ne[1] ? x : ggml_view_2d(ctx, x, x->ne[0], n, x->nb[1], begin * x->nb[1]);
}

ggml_tensor * join(ggml_context * ctx, const std::vector<ggml_tensor *> & outs) {
    ggml_tensor * cur = outs[0];
    for (size_t j = 1; j < outs.size(); ++j) cur = ggml_concat(ctx, cur, outs[j], 1);
    return cur;
}

namespace {

// A part of the step with where its tokens begin in the batch and its own inputs.
struct part_inputs {
    decode_part part;
    int64_t begin;
    ggml_tensor * cells, * mask;
    ggml_tensor * rows;  // paged arenas only, else nullptr
};

std::unique_ptr<graph_result> decoder_graph(const model & m, const std::vector<decode_part> & parts,
                                            const decode_params & p, const std::vector<align_head> & heads) {
    const hparams & hp = m.hp;
    auto res = std::make_unique<graph_result>(max_graph_nodes);
    res->params = p;
    ggml_context * ctx = res->ctx;

    auto input = [ctx](ggml_type type, int64_t ne0, int64_t ne1, const char * name) {
        ggml_tensor * t = ne1 > 0 ? ggml_new_tensor_2d(ctx, type, ne0, ne1) : ggml_new_tensor_1d(ctx, type, ne0);
        ggml_set_name(t, name);
        ggml_set_input(t);
        return t;
    };
    ggml_tensor * tokens = input(GGML_TYPE_I32, p.n_tokens, 0, "tokens");
    ggml_tensor * pos = input(GGML_TYPE_I32, p.n_tokens, 0, "positions");
    ggml_tensor * out_ids = input(GGML_TYPE_I32, p.n_outputs, 0, "out_ids");
    res->inputs.push_back(std::make_unique<tokens_input>(tokens));
    res->inputs.push_back(std::make_unique<positions_input>(pos));
    res->inputs.push_back(std::make_unique<outputs_input>(out_ids));
    std::vector<part_inputs> in;
    int64_t begin = 0;
    for (size_t j = 0; j < parts.size(); ++j) {
        const decode_part & part = parts[j];
        ggml_tensor * cells = input(GGML_TYPE_I64, part.n_tokens, 0, "kv_cells");
        ggml_tensor * mask = input(GGML_TYPE_F16, part.kv->n_ctx(), part.n_tokens, "kq_mask");
        res->inputs.push_back(std::make_unique<cells_input>(cells, j));
        res->inputs.push_back(std::make_unique<mask_input>(mask, j));
        ggml_tensor * rows = nullptr;
        if (part.kv->paged()) {
            rows = input(GGML_TYPE_I32, part.kv->n_ctx(), 0, "kv_rows");
            res->inputs.push_back(std::make_unique<rows_input>(rows, part.kv));
        }
        in.push_back({part, begin, cells, mask, rows});
        begin += part.n_tokens;
    }

    // [n_state, n_tokens]
    ggml_tensor * x = ggml_add(ctx, ggml_get_rows(ctx, m.tok_emb, tokens), ggml_get_rows(ctx, m.dec_pos, pos));
    const int n_head = static_cast<int>(hp.n_text_head);
    // A row no output reads is needed past the last layer's self-attention only for its K/V, which are written
    // by then: from there on the last layer runs on the output rows alone (ref: llama.cpp's inp_out_ids at its
    // last layer). A 223-token prompt that returns one row of logits skips, in base's last layer, the output
    // projection, the cross-attention over 1500 positions and the MLP for 222 rows: 4.4 of the 32 MMAC per
    // token of the 6 layers (tiny.en: 2.8 of 13 in 4). Each row's sums are its own in every CPU kernel (the
    // int8 products, the norms, the cross-attention op), so the output rows' logits are the same bits. One
    // context's step only: the parts of a shared step find their rows by position.
    const bool outputs_only =
        m.last_layer_outputs_only && parts.size() == 1 && p.n_outputs < p.n_tokens && heads.empty();
    for (size_t il = 0; il < m.dec.size(); ++il) {
        const decoder_layer & l = m.dec[il];
        const bool pruned = outputs_only && il + 1 == m.dec.size();
        ggml_tensor * cur = layer_norm(ctx, x, l.attn_ln);
        const std::vector<ggml_tensor *> p = qkv(ctx, m, cur, l.attn);
        ggml_tensor * q = p[0], * k_cur = p[1], * v_cur = p[2];
        std::vector<ggml_tensor *> outs;
        for (const part_inputs & pi : in) {
            // Write this step's K/V rows in place before the attention reads the arena (graph order).
            ggml_build_forward_expand(res->gf, pi.part.kv->cpy_k(ctx, columns(ctx, k_cur, pi.begin, pi.part.n_tokens), pi.cells, il));
            ggml_build_forward_expand(res->gf, pi.part.kv->cpy_v(ctx, columns(ctx, v_cur, pi.begin, pi.part.n_tokens), pi.cells, il));
            const kv_cache & kv = *pi.part.kv;
            ggml_tensor * k = kv.get_k(ctx, il), * v = kv.get_v(ctx, il), * qj = columns(ctx, q, pi.begin, pi.part.n_tokens);
            const bool own_op = m.simd_self && k->type == GGML_TYPE_F16 && pi.part.n_tokens <= self_attention_max_rows;
            if (own_op) {  // reads a paged arena's rows in place
                outs.push_back(decoder_self_attention(ctx, qj, k, v, pi.mask, n_head, pi.rows));
            } else if (pi.rows) {
                outs.push_back(attention(ctx, qj, kv.gather_k(ctx, il, pi.rows), kv.gather_v(ctx, il, pi.rows), pi.mask, n_head));
            } else {
                outs.push_back(attention(ctx, qj, k, v, pi.mask, n_head));
            }
        }
        ggml_tensor * attn = join(ctx, outs);
        if (pruned) {
            attn = ggml_get_rows(ctx, attn, out_ids);
            x = ggml_get_rows(ctx, x, out_ids);
        }
        x = linear(ctx, m, attn, l.attn.o_w, l.attn.o_b, x);

        cur = layer_norm(ctx, x, l.cross_ln);
        q = linear(ctx, m, cur, l.cross.q_w, l.cross.q_b);
        std::vector<int> layer_heads;
        for (const align_head & h : heads) {
            if (h.layer == static_cast<int>(il)) layer_heads.push_back(h.head);
        }
        outs.clear();
        for (const part_inputs & pi : in) {
            ggml_tensor * ck = pi.part.kv->get_cross_k(ctx, il, pi.part.n_cross), * cv = pi.part.kv->get_cross_v(ctx, il, pi.part.n_cross);
            ggml_tensor * qj = pruned ? q : columns(ctx, q, pi.begin, pi.part.n_tokens);
            if (m.simd_cross && layer_heads.empty() && ck->type == GGML_TYPE_F16) {
                outs.push_back(decoder_cross_attention(ctx, qj, ck, cv, n_head));
                continue;
            }
            ggml_tensor * kq = nullptr;
            outs.push_back(cross_attention(ctx, qj, ck, cv, n_head, &kq));
            if (!layer_heads.empty()) {  // one part: alignment is one context's
                ggml_tensor * w = select_heads(ctx, kq, layer_heads);
                res->cross_qk = res->cross_qk ? ggml_concat(ctx, res->cross_qk, w, 2) : w;
            }
        }
        x = linear(ctx, m, join(ctx, outs), l.cross.o_w, l.cross.o_b, x);

        x = mlp(ctx, m, layer_norm(ctx, x, l.mlp_ln), l.mlp, x);
    }
    x = layer_norm(ctx, x, m.dec_ln);
    if (!outputs_only) x = ggml_get_rows(ctx, x, out_ids);  // [n_state, n_outputs]
    output_logits(ctx, m, x, *res);
    if (res->cross_qk) {
        graph_output(res->gf, res->cross_qk, "cross_qk");
    }
    return res;
}

}  // namespace

std::unique_ptr<graph_result> build_decoder(const model & m, const kv_cache & kv, const decode_params & p,
                                            const std::vector<align_head> & heads) {
    return decoder_graph(m, {{&kv, kv.id(), p.n_tokens, p.n_cross}}, p, heads);
}

std::unique_ptr<graph_result> build_decoder(const model & m, const decode_params & p) {
    if (p.parts.empty()) {
        throw std::invalid_argument("a decoder graph of several contexts needs their parts");
    }
    return decoder_graph(m, p.parts, p, {});
}

}  // namespace aural
