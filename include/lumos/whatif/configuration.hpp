#pragma once
// The configuration a what-if starts from and goes to: the traces' GPU preset, the model shape
// (hidden, FFN, heads, sequence, micro-batch, TP) and the kernel cost context of the traces.

#include <lumos/core/error.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/profile.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/structure.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace lumos::whatif {

using model::preset_of_device;

/// The GPU the first trace of `job` names in its deviceProperties ("" when none does).
[[nodiscard]] inline std::string traced_device(const trace::job& job) {
  for (const auto& r : job.ranks) {
    for (const auto& d : r.devices) {
      if (!d.name.empty()) return d.name;
    }
  }
  return {};
}

/// The source GPU of a job: `from` when given, else the GPU its first trace names.
[[nodiscard]] inline model::hardware source_gpu(const trace::job& job, std::string_view from = {}) {
  if (!from.empty()) return model::hardware_preset(from);
  const std::string device = traced_device(job);
  const std::string preset = preset_of_device(device);
  if (preset.empty()) {
    std::string names;
    for (const auto n : model::hardware_preset_names) names += (names.empty() ? "" : ", ") + std::string(n);
    throw error("whatif --gpu: the traces' GPU " + (device.empty() ? std::string("is not named") : "'" + device + "'") +
                " has no hardware preset; say which preset it is with --from-gpu (" + names + ")");
  }
  return model::hardware_preset(preset);
}

/// Checks a tensor-parallel target against the full model: heads and FFN must divide by it.
/// Throws `lumos::error`.
inline void validate_tp(int to_tp, std::int64_t heads, std::int64_t ffn) {
  if (to_tp <= 0)
    throw error("whatif --tp: the tensor-parallel size must be positive (got " + std::to_string(to_tp) + ")");
  if (heads % to_tp != 0) {
    throw error("whatif --tp " + std::to_string(to_tp) + ": the model's " + std::to_string(heads) +
                " attention heads do not divide over " + std::to_string(to_tp) + " tensor-parallel ranks");
  }
  if (ffn % to_tp != 0) {
    throw error("whatif --tp " + std::to_string(to_tp) + ": the FFN width " + std::to_string(ffn) +
                " does not divide over " + std::to_string(to_tp) + " tensor-parallel ranks");
  }
}

/// Target model shape; unset fields keep the traces' own.
struct shape_target {
  std::optional<std::int64_t> hidden, ffn, heads, seq, micro_batch;
  std::optional<int> tp;
  /// Sequence parallelism of the target, for a change from TP 1 (a TP > 1 trace keeps its own).
  std::optional<bool> sp;
  /// Context-parallel size of the target (whatif/context_parallel.hpp).
  std::optional<int> cp;
  /// How the target's CP ranks exchange keys and values (`--cp-comm`; else the traces').
  std::optional<model::cp_comm_kind> cp_comm;

  [[nodiscard]] bool any() const noexcept { return hidden || ffn || heads || seq || micro_batch || tp || sp || cp || cp_comm; }
};

/// One configuration's transformer shape (full model) and tensor-parallel size.
struct shape_config {
  std::int64_t hidden = 0, ffn = 0, heads = 0, head_dim = 0, seq = 0, micro_batch = 0;
  int tp = 1;
  /// Sequence parallelism asked of a target from TP 1. Not read from traces: a TP > 1 trace's own
  /// (a reduce-scatter in its forward passes) is found and kept by `rescale_shape`.
  bool sp = false;
  /// Context-parallel size: each rank holds seq / cp tokens of every sequence (and 1/cp of its
  /// causal attention, causal load balancing), the keys and values of the rest exchanged over
  /// the CP group (whatif/context_parallel.hpp).
  int cp = 1;
  /// How the CP ranks exchange keys and values: ring attention's send/recv or an all-gather before
  /// the attention (p2p at CP 1, where there is nothing to exchange).
  model::cp_comm_kind cp_comm = model::cp_comm_kind::p2p;

  /// Tokens of each sequence one rank holds: seq / cp.
  [[nodiscard]] std::int64_t local_seq() const noexcept { return cp > 1 ? seq / cp : seq; }
  [[nodiscard]] std::int64_t tokens() const noexcept { return local_seq() * micro_batch; }
  [[nodiscard]] std::int64_t ffn_local() const noexcept { return ffn / tp; }
  [[nodiscard]] std::int64_t heads_local() const noexcept { return heads / tp; }
  [[nodiscard]] std::int64_t q_local() const noexcept { return heads_local() * head_dim; }
  friend bool operator==(const shape_config&, const shape_config&) = default;
};

/// The MoE layers and all the layers of one forward pass on rank 0 when the traces mix dense and
/// MoE layers (DeepSeek's first dense layers), whose parameters per layer differ by a count the
/// what-if passes do not make; unset otherwise.
[[nodiscard]] inline std::optional<std::pair<int, int>> mixed_layers(const job_structure& st) {
  const auto& moe = st.moe.layers.value;
  const auto per_pass = st.ranks.empty() ? std::optional<int>{} : st.ranks.front().layers_per_pass.value;
  if (moe && per_pass && *moe > 0 && *moe < *per_pass) return std::pair{*moe, *per_pass};
  return std::nullopt;
}

/// The traces' shape from structure discovery; throws `lumos::error` naming what is unknown.
/// With `moe_layers`, traces whose layers are MoE layers (no dense MLP, so no FFN the GEMMs tell)
/// get FFN 0: their experts are the MoE pass's (whatif/moe.hpp), and only the changes that keep
/// the layer's weights (sequence, micro-batch, CP) may use the shape.
[[nodiscard]] inline shape_config traced_shape(const job_structure& st, bool moe_layers = false) {
  const auto& m = st.model;
  auto need = [](const auto& f, const char* what) {
    if (!f.known()) {
      throw error(std::string("whatif: the traces' ") + what + " is unknown (" + f.source +
                  "); the model-shape rewrites read it from the Input Dims of the layers' GEMMs (record_shapes=True)");
    }
    return static_cast<std::int64_t>(*f.value);
  };
  shape_config c;
  c.hidden = need(m.hidden, "hidden size");
  c.ffn = moe_layers && st.moe.found() && !m.ffn.known() ? 0 : need(m.ffn, "FFN size");
  c.heads = need(m.heads, "head count");
  c.head_dim = need(m.head_dim, "head dimension");
  c.seq = need(m.seq, "sequence length");
  c.micro_batch = need(m.micro_batch_size, "micro-batch size");
  c.tp = static_cast<int>(need(st.parallel.tp, "tensor-parallel size"));
  // Under context parallelism the layers' GEMMs and attention hold a rank's seq / cp tokens:
  // the sequence is the whole one.
  if (st.cp.found() && *st.cp.size.value > 1) {
    c.cp = *st.cp.size.value;
    c.seq *= c.cp;
    if (st.cp.comm.value == "allgather") c.cp_comm = model::cp_comm_kind::allgather;
  }
  return c;
}

/// On traces of MoE layers only (no dense MLP): a change of the layer's weights would have to
/// rewrite the experts too, which the MoE pass does for the expert flags only. The changes of
/// the tokens per rank (sequence, micro-batch, CP) keep the weights: the MoE pass follows them,
/// but not with a layer or stage change (`layers_or_stages`), whose parameters per rank would
/// count the dense weights only.
inline void refuse_moe_weight_changes(const shape_target& t, bool layers_or_stages) {
  if (layers_or_stages) {
    throw error("whatif --seq/--micro-batch/--cp with --layers or --pp: not modelled on traces whose layers are MoE layers "
                "(the parameters per rank would count the dense weights only)");
  }
  const char* flag = t.hidden ? "--hidden" : t.ffn ? "--ffn" : t.heads ? "--heads" : t.tp ? "--tp" : t.sp ? "--sp" : nullptr;
  if (flag == nullptr) return;
  throw error(std::string("whatif ") + flag + ": the traces' layers are MoE layers (no dense MLP); a change of the layer's "
              "weights is not modelled on them (--seq, --micro-batch, --cp and --cp-comm are, with --ep, --experts, --top-k, "
              "--expert-ffn)");
}

/// Throws `lumos::error` when `to` changes the sequence, TP or CP of `from` so that, with sequence
/// parallelism (`sp`: asked, or the traces' own), each CP rank's seq / cp tokens do not split over
/// the TP ranks (as predict checks).
inline void check_sequence_split(const shape_config& from, const shape_config& to, bool sp) {
  if (!sp || to.tp <= 1 || (to.seq == from.seq && to.tp == from.tp && to.cp == from.cp)) return;
  if (to.seq % (std::int64_t{to.tp} * to.cp) != 0) {
    throw error("whatif: the sequence (" + std::to_string(to.seq) + ") is not divisible by TP x CP (" + std::to_string(to.tp) + " x " +
                std::to_string(to.cp) + "): sequence parallelism splits each CP rank's tokens over the TP ranks");
  }
}

/// The target shape: `t` applied to `from`. The head dimension follows hidden / heads when the
/// traced model has heads·d = hidden (Megatron's default), else it stays. Throws `lumos::error`
/// for a target that is not a valid transformer (non-positive sizes, hidden not divisible by
/// heads, heads or FFN not divisible by TP).
[[nodiscard]] inline shape_config target_shape(const shape_config& from, const shape_target& t) {
  shape_config to = from;
  auto positive = [](const auto& v, const char* flag) {
    if (v && *v <= 0)
      throw error(std::string("whatif ") + flag + ": must be positive (got " + std::to_string(*v) + ")");
  };
  positive(t.hidden, "--hidden"), positive(t.ffn, "--ffn"), positive(t.heads, "--heads"), positive(t.seq, "--seq");
  positive(t.micro_batch, "--micro-batch"), positive(t.tp, "--tp");
  if (t.hidden) to.hidden = *t.hidden;
  if (t.ffn) {
    to.ffn = *t.ffn;
  } else if (t.hidden && from.ffn == 4 * from.hidden) {
    to.ffn = 4 * to.hidden;  // as `lumos predict --hidden` on a model whose FFN is 4h (GPT-3)
  }
  if (t.heads) to.heads = *t.heads;
  if (t.seq) to.seq = *t.seq;
  if (t.micro_batch) to.micro_batch = *t.micro_batch;
  if (t.tp) to.tp = *t.tp;
  if (t.cp) {
    if (*t.cp <= 0) throw error("whatif --cp: must be positive (got " + std::to_string(*t.cp) + ")");
    to.cp = *t.cp;
  }
  if (t.cp_comm) {
    if (to.cp <= 1) {
      throw error(std::string("whatif --cp-comm ") + std::string(model::to_string(*t.cp_comm)) +
                  ": the target has no context parallelism (CP 1); --cp N sets it");
    }
    to.cp_comm = *t.cp_comm;
  }
  if (to.cp <= 1) to.cp_comm = model::cp_comm_kind::p2p;
  if (to.cp > 1 && to.seq % (2 * std::int64_t{to.cp}) != 0) {
    throw error("whatif --cp " + std::to_string(to.cp) + ": the sequence (" + std::to_string(to.seq) + ") must be divisible by 2 * cp (" +
                std::to_string(2 * std::int64_t{to.cp}) + "): causal load balancing splits each sequence into 2 * cp chunks");
  }
  if (t.sp) {
    if (from.tp > 1) {
      throw error("whatif --sp: applies to a change from TP 1; the traces run TP " + std::to_string(from.tp) +
                  ", whose own sequence parallelism (or its absence) is kept");
    }
    if (*t.sp && to.tp <= 1) throw error("whatif --sp on: needs a tensor-parallel size above 1 (--tp)");
    to.sp = *t.sp;
  }
  check_sequence_split(from, to, to.sp);
  if (from.heads * from.head_dim == from.hidden && (to.hidden != from.hidden || to.heads != from.heads)) {
    if (to.hidden % to.heads != 0) {
      throw error("whatif: hidden " + std::to_string(to.hidden) + " does not divide into " + std::to_string(to.heads) +
                  " heads (the traced model has head dim = hidden / heads)");
    }
    to.head_dim = to.hidden / to.heads;
  }
  validate_tp(to.tp, to.heads, to.ffn);
  return to;
}

/// The cost-model context of a rescaling: the source GPU's kernel-level profile and peaks.
struct shape_costs {
  model::cost_profile profile = model::h100_profile();
  model::hardware hw = model::hardware_preset("h100-sxm");
  model::precision dtype = model::precision::bf16;
  double element_bytes = 2; ///< activation element size
};

/// The cost context of a job: the kernel-level profile and peaks of its GPU (`from_gpu`, else
/// the traces' device name; H100 when neither names a preset, said in `note`) and the dtype of
/// its GEMM kernels.
[[nodiscard]] inline shape_costs costs_of(const trace::job& job, const job_structure& st, std::string_view from_gpu,
                                          std::string* note, const model::cost_profile* profile = nullptr) {
  shape_costs c;
  std::string preset(profile != nullptr ? profile->hardware : std::string(from_gpu));
  if (preset.empty()) {
    for (const auto& r : job.ranks) {
      for (const auto& d : r.devices) {
        if (preset.empty() && !d.name.empty()) preset = model::preset_of_device(d.name);
      }
    }
  }
  if (preset.empty()) {
    if (note)
      *note =
          "the traces' GPU names no preset: the shape rescaling uses the h100-sxm cost profile (--from-gpu chooses)";
    preset = "h100-sxm";
  }
  c.profile = profile != nullptr ? *profile : model::profile_preset(preset);  // a calibrated cluster, else the preset
  c.hw = model::hardware_preset(preset);
  const std::string dt = st.model.dtype.value.value_or("bf16");
  c.dtype = dt == "fp16" ? model::precision::fp16 : dt == "fp8" ? model::precision::fp8 : model::precision::bf16;
  c.element_bytes = dt == "fp32" || dt == "tf32" ? 4.0 : dt == "fp8" ? 1.0 : 2.0;
  if (dt == "fp8" && c.hw.gpu.fp8_flops <= 0) c.dtype = model::precision::bf16;
  return c;
}

}  // namespace lumos::whatif
