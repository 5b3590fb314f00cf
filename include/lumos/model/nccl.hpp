#pragma once
// NCCL communication model: latency + bandwidth per protocol (LL, Simple) and link class, with
// nccl-tests bus-bandwidth conventions, hierarchical for groups that span nodes.

#include <lumos/core/error.hpp>
#include <lumos/core/time.hpp>
#include <lumos/model/comm.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/profile.hpp>

#include <algorithm>

namespace lumos::model {

/// Time (ns, unrounded) of collective `c` moving `bytes` over `n` ranks that all use `link`:
/// the faster of the LL and Simple protocols (NCCL's tuner picks by size the same way), each
/// base + steps * step + bus_factor * bytes / bandwidth. All-reduce uses `allreduce_busbw`
/// when set (NVLS / in-network reduction). O(1).
[[nodiscard]] inline double nccl_flat_ns(collective c, double bytes, std::int64_t n, const nccl_link& link) noexcept {
  if (n <= 1 || bytes <= 0) return 0.0;
  const double steps = static_cast<double>(ring_steps(c, n));
  const double bw = c == collective::all_reduce && link.allreduce_busbw > 0 ? link.allreduce_busbw : link.busbw;
  const double moved = bus_factor(c, n) * bytes * 1e9;
  const double simple = link.simple_base_ns + steps * link.simple_step_ns + moved / bw;
  const double ll = link.ll_base_ns + steps * link.ll_step_ns + moved / (bw * link.ll_fraction);
  return std::min(simple, ll);
}

/// `CommModel` over a `cost_profile`. Groups inside one node use the NVLink figures; groups with
/// one rank per node the NIC figures; mixed groups are hierarchical as in `ring_alpha_beta`
/// (reduce-scatter in the node, the collective across nodes on 1/r of the data, all-gather in
/// the node). Point-to-point: Simple base latency + bytes / busbw of the link. No contention
/// between concurrent collectives.
struct nccl_model {
  cost_profile profile = h100_profile();

  [[nodiscard]] time_ns collective_time(const collective_op& op, const hardware& hw) const {
    if (op.bytes < 0) throw error("collective size must be non-negative");
    op.group.validate(hw);
    const auto B = static_cast<double>(op.bytes);
    const std::int64_t n = op.group.size, r = op.group.ranks_per_node, N = op.group.nodes();
    const nccl_link& in = profile.intra;
    const nccl_link& out = profile.inter;
    double t = 0;
    if (n <= 1 || B <= 0) {
      t = 0;
    } else if (N == 1) {
      t = nccl_flat_ns(op.kind, B, n, in);
    } else if (r == 1) {
      t = nccl_flat_ns(op.kind, B, n, out);
    } else {
      const double per = B / static_cast<double>(r);
      switch (op.kind) {
        case collective::all_reduce:
          t = nccl_flat_ns(collective::reduce_scatter, B, r, in) + nccl_flat_ns(collective::all_reduce, per, N, out) +
              nccl_flat_ns(collective::all_gather, B, r, in);
          break;
        case collective::reduce_scatter:
          t = nccl_flat_ns(collective::reduce_scatter, B, r, in) + nccl_flat_ns(collective::reduce_scatter, per, N, out);
          break;
        case collective::all_gather:
          t = nccl_flat_ns(collective::all_gather, per, N, out) + nccl_flat_ns(collective::all_gather, B, r, in);
          break;
        case collective::broadcast:
          t = nccl_flat_ns(collective::broadcast, B, N, out) + nccl_flat_ns(collective::broadcast, B, r, in);
          break;
        case collective::all_to_all:
          t = std::max(nccl_flat_ns(collective::all_to_all, B * static_cast<double>(r) / static_cast<double>(n), r, in),
                       nccl_flat_ns(collective::all_to_all, B * static_cast<double>(n - r) / static_cast<double>(n),
                                    n - r + 1, out));
          break;
      }
    }
    return detail::round_ns(t);
  }

  [[nodiscard]] time_ns p2p_time(const p2p_op& op, const hardware&) const {
    if (op.bytes < 0) throw error("p2p size must be non-negative");
    if (op.bytes == 0) return 0;
    const nccl_link& l = op.same_node ? profile.intra : profile.inter;
    return detail::round_ns(l.simple_base_ns + static_cast<double>(op.bytes) / l.busbw * 1e9);
  }
};
static_assert(CommModel<nccl_model>);

}  // namespace lumos::model
