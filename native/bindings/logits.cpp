// Whisper's logit rules and top_logprobs over the rows of a decoder step's logits, for the Python decoding
// strategies.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "bindings.h"
#include "logits.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

using farray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using sequences = std::vector<std::vector<int32_t>>;

void check_k(int k, py::ssize_t n_vocab) {
    if (k < 1 || k > 64 || k > n_vocab) {
        throw std::invalid_argument("top_logprobs: k must be in 1..min(64, n_vocab)");
    }
}

// ids int32 (n_rows, k), log-probabilities float64 (n_rows, k) and log normalisers float64 (n_rows,), row i
// written by rank(i, ids, logprobs, log_norm) with the GIL released.
template <typename Rank> py::tuple ranked_rows(py::ssize_t n_rows, int k, Rank rank) {
    py::array_t<int32_t> ids({n_rows, static_cast<py::ssize_t>(k)});
    py::array_t<double> logprobs({n_rows, static_cast<py::ssize_t>(k)});
    py::array_t<double> norms(n_rows);
    int32_t * out_ids = ids.mutable_data();
    double * out_lp = logprobs.mutable_data();
    double * out_norm = norms.mutable_data();
    {
        py::gil_scoped_release release;
        for (py::ssize_t i = 0; i < n_rows; ++i) {
            rank(i, out_ids + i * k, out_lp + i * k, out_norm + i);
        }
    }
    return py::make_tuple(ids, logprobs, norms);
}

// logits: (n, n_vocab) or (n_vocab,) -> ids int32 (n, k), log-probabilities float64 (n, k), log
// normalisers float64 (n,), with the leading axis dropped for a 1-D input.
py::tuple top_logprobs(const farray & logits, int k) {
    if (logits.ndim() != 1 && logits.ndim() != 2) {
        throw std::invalid_argument("top_logprobs takes logits of shape (n_vocab,) or (n, n_vocab)");
    }
    const py::ssize_t n_vocab = logits.shape(logits.ndim() - 1);
    const py::ssize_t n_rows = logits.ndim() == 2 ? logits.shape(0) : 1;
    check_k(k, n_vocab);
    const float * in = logits.data();
    py::tuple out = ranked_rows(n_rows, k, [&](py::ssize_t i, int32_t * ids, double * logprobs, double * norm) {
        aural::top_logprobs(in + i * n_vocab, n_vocab, k, ids, logprobs, norm);
    });
    if (logits.ndim() == 1) {
        return py::make_tuple(out[0][py::int_(0)], out[1][py::int_(0)], out[2][py::int_(0)]);
    }
    return out;
}

logit_rules make_rules(int64_t n_vocab, std::vector<int32_t> blank, std::vector<int32_t> suppressed,
                       bool timestamps, int32_t eot, int32_t timestamp_begin, int32_t no_timestamps,
                       int32_t max_initial_timestamp) {
    logit_rules r;
    r.n_vocab = n_vocab;
    r.blank = std::move(blank);
    r.suppressed = std::move(suppressed);
    r.timestamps = timestamps;
    r.eot = eot;
    r.timestamp_begin = timestamp_begin;
    r.no_timestamps = no_timestamps;
    r.max_initial_timestamp = max_initial_timestamp;
    r.check();
    return r;
}

void check_row(const logit_rules & r, const farray & row) {
    if (row.ndim() != 1 || row.shape(0) != r.n_vocab) {
        throw std::invalid_argument("logit rules take a row of n_vocab logits");
    }
}

// A filtered copy of one row of logits.
farray apply(const logit_rules & r, const farray & row, const std::vector<int32_t> & sampled) {
    check_row(r, row);
    farray out(r.n_vocab);
    std::memcpy(out.mutable_data(), row.data(), sizeof(float) * r.n_vocab);
    apply_rules(r, sampled.data(), sampled.size(), out.mutable_data());
    return out;
}

// logits (n, n_vocab), sampled: n token lists -> top_logprobs of each row after its rules; the input is
// left as it was (each row is filtered in a scratch copy).
py::tuple rules_top_logprobs(const logit_rules & r, const farray & logits, const sequences & sampled, int k) {
    if (logits.ndim() != 2 || logits.shape(1) != r.n_vocab) {
        throw std::invalid_argument("LogitRules.top_logprobs takes logits of shape (n, n_vocab)");
    }
    const py::ssize_t n_rows = logits.shape(0);
    if (static_cast<py::ssize_t>(sampled.size()) != n_rows) {
        throw std::invalid_argument("LogitRules.top_logprobs needs one list of sampled tokens per row");
    }
    check_k(k, r.n_vocab);
    const float * in = logits.data();
    std::vector<float> scratch(r.n_vocab);
    return ranked_rows(n_rows, k, [&](py::ssize_t i, int32_t * ids, double * logprobs, double * norm) {
        std::memcpy(scratch.data(), in + i * r.n_vocab, sizeof(float) * r.n_vocab);
        apply_rules(r, sampled[i].data(), sampled[i].size(), scratch.data());
        aural::top_logprobs(scratch.data(), r.n_vocab, k, ids, logprobs, norm);
    });
}

}  // namespace

void register_logits(py::module_ & m) {
    m.def("top_logprobs", &top_logprobs, py::arg("logits"), py::arg("k"),
          "The k largest logits of each row as (ids int32, log-probabilities float64, log normaliser): "
          "best first, ties to the lower id; log-probabilities are logit - log sum exp(row).");
    py::class_<logit_rules>(m, "LogitRules",
                            "Whisper's logit filters for one window (openai-whisper's SuppressBlank, "
                            "SuppressTokens, ApplyTimestampRules), applied natively to a step's rows.")
        .def(py::init(&make_rules), py::arg("n_vocab"), py::arg("blank"), py::arg("suppressed"),
             py::arg("timestamps"), py::arg("eot"), py::arg("timestamp_begin"), py::arg("no_timestamps"),
             py::arg("max_initial_timestamp") = -1,
             "blank: ids forbidden at the first sampled position (empty: off); suppressed: ids forbidden "
             "at every step; timestamps: Whisper's timestamp grammar on eot, timestamp_begin and "
             "no_timestamps, the first timestamp at most max_initial_timestamp (< 0: no cap). Raises "
             "ValueError on an id outside the vocabulary.")
        .def_readonly("n_vocab", &logit_rules::n_vocab)
        .def_readonly("blank", &logit_rules::blank)
        .def_readonly("suppressed", &logit_rules::suppressed)
        .def_readonly("timestamps", &logit_rules::timestamps)
        .def_readonly("max_initial_timestamp", &logit_rules::max_initial_timestamp)
        .def("apply", &apply, py::arg("logits"), py::arg("sampled"),
             "A copy of one row of logits (n_vocab,) with the tokens the rules forbid after `sampled` "
             "(the tokens sampled so far in the window) at -inf.")
        .def("top_logprobs", &rules_top_logprobs, py::arg("logits"), py::arg("sampled"), py::arg("k"),
             "top_logprobs of each row of logits (n, n_vocab) after the rules for its own sampled tokens "
             "(n lists): (ids int32 (n, k), log-probabilities float64 (n, k), log normalisers (n,)). The "
             "logits are not modified.");
}

}  // namespace aural::bindings
