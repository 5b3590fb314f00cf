# Type stubs of the lumos Python package (see __init__.py for the documentation).
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

PathLike = Union[str, os.PathLike[str]]

__version__: str
BREAKDOWN_COLUMNS: Tuple[str, str, str, str, str]

class LumosError(RuntimeError): ...

class Job:
    paths: List[str]
    @property
    def ranks(self) -> List[int]: ...
    @property
    def files(self) -> List[str]: ...
    def __len__(self) -> int: ...
    def inspect(self, structure: bool = ..., groups: bool = ...) -> Dict[str, Any]: ...

def load_job(paths: Union[PathLike, Iterable[PathLike]], threads: int = ...) -> Job: ...

class RankReplay:
    rank: int
    file: str
    step: str
    measured_ns: int
    simulated_ns: int
    error: float
    breakdown: Dict[str, int]
    breakdown_measured: Dict[str, int]
    sm_utilization: float
    sm_utilization_measured: float
    def to_dict(self) -> Dict[str, Any]: ...

class Timeline:
    COLUMNS: Tuple[str, ...]
    rank: int
    origin_ns: int
    window_ns: Tuple[int, int]
    measured_window_ns: Tuple[int, int]
    kind_names: List[str]
    processors: List[Dict[str, Any]]
    name: List[str]
    task: npt.NDArray[np.uint32]
    processor: npt.NDArray[np.uint32]
    kind: npt.NDArray[np.uint8]
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    duration_ns: npt.NDArray[np.int64]
    measured_start_ns: npt.NDArray[np.int64]
    measured_end_ns: npt.NDArray[np.int64]
    def __len__(self) -> int: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_pandas(self) -> Any: ...

class Replay:
    measured_ns: int
    simulated_ns: int
    error: float
    unprofiled_ns: int
    ranks: List[RankReplay]
    scales: Dict[str, Any]
    graph: Dict[str, int]
    dependencies: Dict[str, int]
    causality: Dict[str, Any]
    clocks: Dict[str, Any]
    gpu_ops_bound_by: Dict[str, int]
    overheads: List[Dict[str, Any]]
    collectives: Dict[str, Any]
    def rank(self, rank: int) -> RankReplay: ...
    def breakdowns(self, simulated: bool = ...) -> npt.NDArray[np.int64]: ...
    def timeline(self, rank: int) -> Timeline: ...
    def sm_utilization_series(self, rank: int, simulated: bool = ...) -> npt.NDArray[np.float64]: ...
    def critical_path(self, rank: Optional[int] = ...) -> Dict[str, Any]: ...
    def frozen(self) -> List[Dict[str, Any]]: ...
    def html(self, title: Optional[str] = ...) -> str: ...
    def report(self, path: PathLike, title: Optional[str] = ...) -> str: ...
    def write_trace(self, path: PathLike, gzip: bool = ...) -> List[str]: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_pandas(self) -> Any: ...

def replay(job: Union[Job, PathLike, Iterable[PathLike]], scale: Optional[Mapping[str, float]] = ...,
           step: Optional[int] = ..., baseline: bool = ...) -> Replay: ...

class WhatIf:
    baseline: Replay
    predicted: Replay
    changes: List[Dict[str, Any]]
    change_texts: List[str]
    iteration_ns: int
    baseline_ns: int
    speedup: float
    unprofiled_ns: int
    baseline_unprofiled_ns: int
    bound_by: str
    critical_path_shares: Dict[str, Optional[Dict[str, float]]]
    attribution: Dict[str, Any]
    shape: Optional[Dict[str, Any]]
    pipeline: Optional[Dict[str, Any]]
    structure: Optional[Dict[str, Any]]
    folded: Optional[Dict[str, Any]]
    trace_note: str
    def html(self, title: Optional[str] = ...) -> str: ...
    def report(self, path: PathLike, title: Optional[str] = ...) -> str: ...
    def write_trace(self, path: PathLike, gzip: bool = ...) -> List[str]: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_pandas(self) -> Any: ...

def whatif(job: Union[Job, PathLike, Iterable[PathLike]], *, layers: Optional[int] = ..., gpu: Optional[str] = ...,
           from_gpu: Optional[str] = ..., dp: Optional[int] = ..., pp: Optional[int] = ..., vp: Optional[int] = ...,
           tp: Optional[int] = ..., sp: Optional[Union[bool, str]] = ..., global_batch: Optional[int] = ...,
           micro_batch: Optional[int] = ..., hidden: Optional[int] = ..., ffn: Optional[int] = ...,
           heads: Optional[int] = ..., seq: Optional[int] = ..., schedule: Optional[str] = ...,
           profile: Optional[PathLike] = ..., step: Optional[int] = ..., scale: Optional[Mapping[str, float]] = ...,
           fold: bool = ..., host_speed: Optional[Union[float, PathLike]] = ..., precision: Optional[str] = ...,
           cp: Optional[int] = ..., fsdp: Optional[Union[bool, str]] = ..., hsdp: Optional[int] = ...,
           reshard_after_forward: Optional[Union[bool, str]] = ..., ep: Optional[int] = ..., experts: Optional[int] = ...,
           top_k: Optional[int] = ..., expert_ffn: Optional[int] = ..., routing: Optional[str] = ...,
           cp_comm: Optional[str] = ...) -> WhatIf: ...

class Prediction:
    iteration_ns: int
    tokens_per_s: float
    tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    pipeline_ns: int
    sm_utilization: float
    breakdown: Dict[str, int]
    memory_bytes_per_gpu: Dict[str, Any]
    stages: List[Dict[str, Any]]
    job: Dict[str, Any]
    graph: Dict[str, Any]
    def to_dict(self) -> Dict[str, Any]: ...
    def to_pandas(self) -> Any: ...

def predict(*, model: str = ..., layers: int = ..., hidden: int = ..., ffn: int = ..., heads: int = ...,
            kv_heads: int = ..., seq: int = ..., vocab: int = ..., tp: int = ..., pp: int = ..., dp: int = ...,
            vp: int = ..., sp: Union[bool, str] = ..., micro_batch: int = ..., global_batch: int = ...,
            schedule: str = ..., recompute: str = ..., gpu: str = ..., precision: str = ...,
            profile: str = ..., attention: str = ..., cost_model: str = ..., forward_only: bool = ...,
            unfold: bool = ..., mtp_layers: int = ..., routing: str = ...,
            routing_from: PathLike = ..., experts: int = ..., top_k: int = ..., expert_ffn: int = ...,
            ep: int = ..., expert_tp: int = ..., tp_comm_overlap: Union[bool, str] = ...,
            overlap_param_gather: Union[bool, str] = ..., distributed_optimizer: Union[bool, str] = ...,
            shared_experts: int = ..., moe_dispatcher: str = ...,
            capacity_factor: Union[float, str] = ..., cp: int = ..., cp_comm: str = ..., fsdp: Union[bool, str] = ...,
            hsdp: int = ..., reshard_after_forward: Union[bool, str] = ..., pipeline_layout: str = ...,
            decoder_first_pipeline_num_layers: int = ..., decoder_last_pipeline_num_layers: int = ...) -> Prediction: ...

_List = Union[int, str, Sequence[Union[int, str, bool]]]

class Sweep:
    configurations: int
    accepted: int
    @property
    def ranked(self) -> List[Dict[str, Any]]: ...
    @property
    def best(self) -> Optional[Dict[str, Any]]: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def to_pandas(self) -> Any: ...

def sweep(*, gpus: int, model: str = ..., layers: int = ..., hidden: int = ..., ffn: int = ..., heads: int = ...,
          kv_heads: int = ..., seq: int = ..., vocab: int = ..., gpu: str = ..., precision: str = ...,
          profile: str = ..., cost_model: str = ..., tp: _List = ..., pp: _List = ..., dp: _List = ...,
          vp: _List = ..., micro_batch: _List = ..., schedule: _List = ..., recompute: _List = ..., sp: _List = ...,
          global_batch: int = ..., memory_margin: float = ..., top: int = ..., threads: int = ...,
          tp_comm_overlap: _List = ..., overlap_param_gather: Union[bool, str] = ...,
          distributed_optimizer: Union[bool, str] = ..., attention: str = ...,
          forward_only: bool = ..., unfold: bool = ..., mtp_layers: int = ..., experts: int = ..., top_k: int = ...,
          expert_ffn: int = ..., ep: _List = ..., expert_tp: int = ..., shared_experts: int = ..., moe_dispatcher: str = ...,
          capacity_factor: Union[float, str] = ..., cp: _List = ..., cp_comm: str = ..., fsdp: _List = ..., hsdp: int = ...,
          reshard_after_forward: Union[bool, str] = ..., pipeline_layout: str = ...) -> Sweep: ...

def calibrate(paths: Union[PathLike, Iterable[PathLike]], rank: Optional[int] = ...,
              output: Optional[PathLike] = ...) -> Dict[str, Any]: ...
