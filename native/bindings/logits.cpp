// top_logprobs over the rows of a decoder step's (filtered) logits, for the Python decoding strategies.
#include <pybind11/numpy.h>

#include <stdexcept>

#include "bindings.h"
#include "logits.h"

namespace py = pybind11;

namespace aural::bindings {

namespace {

using farray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// logits: (n, n_vocab) or (n_vocab,) -> ids int32 (n, k), log-probabilities float64 (n, k), log
// normalisers float64 (n,), with the leading axis dropped for a 1-D input.
py::tuple top_logprobs(const farray & logits, int k) {
    if (logits.ndim() != 1 && logits.ndim() != 2) {
        throw std::invalid_argument("top_logprobs takes logits of shape (n_vocab,) or (n, n_vocab)");
    }
    const py::ssize_t n_vocab = logits.shape(logits.ndim() - 1);
    const py::ssize_t n_rows = logits.ndim() == 2 ? logits.shape(0) : 1;
    if (k < 1 || k > 64 || k > n_vocab) {
        throw std::invalid_argument("top_logprobs: k must be in 1..min(64, n_vocab)");
    }
    py::array_t<int32_t> ids({n_rows, static_cast<py::ssize_t>(k)});
    py::array_t<double> logprobs({n_rows, static_cast<py::ssize_t>(k)});
    py::array_t<double> norms(n_rows);
    {
        const float * in = logits.data();
        int32_t * out_ids = ids.mutable_data();
        double * out_lp = logprobs.mutable_data();
        double * out_norm = norms.mutable_data();
        py::gil_scoped_release release;
        for (py::ssize_t r = 0; r < n_rows; ++r) {
            aural::top_logprobs(in + r * n_vocab, n_vocab, k, out_ids + r * k, out_lp + r * k, out_norm + r);
        }
    }
    if (logits.ndim() == 1) {
        return py::make_tuple(ids[py::int_(0)], logprobs[py::int_(0)], norms[py::int_(0)]);
    }
    return py::make_tuple(ids, logprobs, norms);
}

}  // namespace

void register_logits(py::module_ & m) {
    m.def("top_logprobs", &top_logprobs, py::arg("logits"), py::arg("k"),
          "The k largest logits of each row as (ids int32, log-probabilities float64, log normaliser): "
          "best first, ties to the lower id; log-probabilities are logit - log sum exp(row).");
}

}  // namespace aural::bindings
