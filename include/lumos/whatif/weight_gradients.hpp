#pragma once
// The weight-gradient ops of the traced backward passes, which a zero-bubble schedule defers to
// its W passes.

#include <lumos/core/strings.hpp>
#include <lumos/graph/trace_builder.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/configuration.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/structure.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lumos::whatif {

/// The GPU ops of the backward passes that a zero-bubble schedule defers to its W passes, per
/// task of `b`'s graph (1: weight gradient): the linear layers' and the logits' weight-gradient
/// GEMMs (the tokens are their K: [in, tokens] x [tokens, out]), the biases' (a sum over the
/// tokens: a reduction under aten::sum or a linear layer's autograd node, AddmmBackward), the
/// LayerNorms' (PyTorch's GammaBetaBackward, or a kernel named wgrad) and the embedding's
/// (embedding_dense_backward). When the tokens equal a width, a GEMM with the dims of the dgrad
/// right before it is that dgrad's weight gradient (autograd runs them back to back). `a` is the
/// traces' shape (`traced_shape`).
[[nodiscard]] inline std::vector<std::uint8_t> weight_gradient_tasks(const trace::job& job, const graph::built_job& b,
                                                                     const job_structure& st, const shape_config& a) {
  std::vector<std::uint8_t> weight(b.graph.task_count(), 0);
  const std::int64_t tokens = a.tokens();
  struct last_gemm {
    std::uint32_t op = detail::no_event;  // its operator (split-K kernels share it)
    bool weight = false;
    std::optional<std::array<std::int64_t, 3>> dgrad;  // dims of an open dgrad, as a multiset
  };
  std::vector<last_gemm> last(job.ranks.size());
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.rank >= job.ranks.size() || c.rank >= b.ranks.size() || c.phase != phase_kind::backward || c.pass < 0 || c.comm) continue;
    const trace::rank_trace& tr = job.ranks[c.rank];
    const auto& map = b.ranks[c.rank].task_of_event;
    const graph::task_id t = c.op < map.size() ? map[c.op] : graph::no_task;
    last_gemm& l = last[c.rank];
    const std::string lname = lower_ascii(tr.name(tr.events[c.op]));
    const std::string op = c.cpu_op != detail::no_event ? lower_ascii(tr.name(tr.events[c.cpu_op])) : std::string();
    bool w = lname.find("gammabetabackward") != std::string::npos || lname.find("wgrad") != std::string::npos ||
             lname.find("embedding_backward") != std::string::npos || op.find("embedding_dense_backward") != std::string::npos ||
             (c.shape_op == detail::no_event && lname.find("reduce_kernel") != std::string::npos &&
              (op == "aten::sum" || op.find("addmmbackward") != std::string::npos));
    std::optional<detail::gemm_shape> gs;
    if (!w && c.shape_op != detail::no_event) {
      gs = detail::gemm_of(tr.name(tr.events[c.shape_op]), detail::parse_dims(tr.arg_text(c.shape_op, trace::arg_key::input_dims)));
    }
    if (gs && gs->kind == detail::gemm_shape::role::linear) {
      if (c.shape_op == l.op) {
        w = l.weight;  // another kernel of the same operator
      } else {
        std::array<std::int64_t, 3> dims{gs->m, gs->k, gs->n};
        std::sort(dims.begin(), dims.end());
        const bool tokens_in_k = gs->k == tokens, tokens_out = gs->m == tokens || gs->n == tokens;
        w = tokens_in_k && (!tokens_out || (l.dgrad && *l.dgrad == dims));
        l.op = c.shape_op, l.weight = w;
        l.dgrad = !w && tokens_out ? std::optional(dims) : std::nullopt;
      }
    } else if (lname.find("reduce") == std::string::npos) {
      l.dgrad.reset();  // another kernel between them: not a dgrad and its weight gradient
    }
    if (w && t != graph::no_task) weight[t] = 1;
  }
  return weight;
}

}  // namespace lumos::whatif
