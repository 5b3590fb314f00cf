"""The lumos Python package against the lumos CLI: same numbers, same messages."""
import json
import re
import subprocess
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest

import lumos

RANK_FIELDS = ("rank", "file", "step", "measured_ns", "simulated_ns", "error", "breakdown", "breakdown_measured",
               "sm_utilization", "sm_utilization_measured")


def assert_same_replay(py, cli_json):
    """Every number the CLI prints is the one Python holds (== on ints and on doubles)."""
    d = py.to_dict()
    assert d["job"] == cli_json["job"]
    assert (py.measured_ns, py.simulated_ns, py.error) == (cli_json["job"]["measured_ns"], cli_json["job"]["simulated_ns"],
                                                           cli_json["job"]["error"])
    assert d["scales"] == cli_json["scales"]
    assert len(d["ranks"]) == len(cli_json["ranks"])
    for mine, theirs in zip(d["ranks"], cli_json["ranks"]):
        for field in RANK_FIELDS:
            assert mine[field] == theirs[field], field
        # The rest of a rank's object has methods of its own (sm_utilization_series, frozen).
        assert set(theirs) - set(mine) == {"sm_utilization_series", "frozen"}
    for section in ("graph", "dependencies", "causality", "clocks", "gpu_ops_bound_by", "overheads", "collectives"):
        assert d[section] == cli_json[section], section


def test_replay_matches_cli_on_the_example_job(example_job, cli):
    job = lumos.load_job(example_job)
    assert job.ranks == [0, 1]
    r = lumos.replay(job)
    assert_same_replay(r, cli("replay", example_job, "--json"))
    assert [x.rank for x in r.ranks] == [0, 1]


def test_replay_matches_cli_on_a_shared_trace(megatron, cli):
    job = lumos.load_job([megatron])
    assert len(job) == 8
    assert_same_replay(lumos.replay(job), cli("replay", megatron, "--json"))
    what_if = lumos.replay(job, scale={"compute": 0.5, "op:gemm": 0.8})
    assert_same_replay(what_if, cli("replay", megatron, "--scale", "compute=0.5", "--scale", "op:gemm=0.8", "--json"))
    assert what_if.simulated_ns != lumos.replay(job).simulated_ns


def test_step_and_critical_path_match_cli(megatron, cli):
    job = lumos.load_job(megatron)
    steps = [s["name"] for s in job.inspect()["ranks"][0]["steps"]]
    first = int(steps[0].split("#")[1])
    r = lumos.replay(job, step=first)
    theirs = cli("replay", megatron, "--step", first, "--critical-path", "--json")
    assert_same_replay(r, theirs)
    path = r.critical_path()
    assert path["rank"] == theirs["critical_path_rank"]
    for key in ("begin_ns", "end_ns", "attribution"):
        assert path[key] == theirs["critical_path"][key]
    assert [(s["category"], s["begin_ns"], s["end_ns"], s["processor"]) for s in path["segments"]] == \
           [(s["category"], s["begin_ns"], s["end_ns"], s["processor"]) for s in theirs["critical_path"]["segments"]]


def test_frozen_and_sm_series_match_cli(megatron, cli):
    np = pytest.importorskip("numpy")
    r = lumos.replay(megatron)
    theirs = cli("replay", megatron, "--json")
    frozen = r.frozen()
    assert [f.pop("rank") for f in frozen] == [x["rank"] for x in theirs["ranks"]]
    assert frozen == [x["frozen"] for x in theirs["ranks"]]
    assert any(f["total_ns"] > 0 and f["largest"] for f in frozen)
    for x in theirs["ranks"]:
        series = r.sm_utilization_series(x["rank"])
        assert series.dtype == np.float64 and series.tolist() == x["sm_utilization_series"]


def test_inspect_matches_cli(example_job, cli):
    assert lumos.load_job(str(example_job)).inspect() == cli("inspect", example_job, "--json")


def test_breakdowns_are_numpy_rows_of_the_per_rank_breakdown(example_job):
    np = pytest.importorskip("numpy")
    r = lumos.replay(example_job)
    for simulated, key in ((True, "breakdown"), (False, "breakdown_measured")):
        a = r.breakdowns(simulated)
        assert isinstance(a, np.ndarray) and a.dtype == np.int64 and a.shape == (len(r.ranks), 5)
        for row, rank in zip(a, r.ranks):
            assert row.tolist() == [getattr(rank, key)[c] for c in lumos.BREAKDOWN_COLUMNS]
    # The four parts add up to each rank's simulated window.
    a = r.breakdowns()
    assert a[:, :4].sum(axis=1).tolist() == [x.simulated_ns for x in r.ranks]


def kineto_gpu_ops(path):
    """(absolute ns, duration ns, name) of every GPU op in a Kineto file, read exactly."""
    data = json.loads(Path(path).read_text(), parse_float=Decimal)
    ops = []
    for e in data["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            ops.append((int(e["ts"] * 1000), int(e["dur"] * 1000), e["name"]))
    return sorted(ops)


def test_numpy_timeline_matches_the_trace_writer(example_job, tmp_path, cli):
    np = pytest.importorskip("numpy")
    r = lumos.replay(example_job)
    files = r.write_trace(tmp_path / "py")
    assert len(files) == 2
    # The Python writer is the CLI's writer: byte-identical files.
    cli("replay", example_job, "--trace-out", tmp_path / "cli", "--json")
    for f in files:
        assert Path(f).read_bytes() == (tmp_path / "cli" / Path(f).name).read_bytes()
    for rank in r.ranks:
        t = r.timeline(rank.rank)
        assert isinstance(t.start_ns, np.ndarray) and t.start_ns.dtype == np.int64
        compute = t.kind == t.kind_names.index("gpu_compute")
        mine = sorted((int(t.origin_ns + b), int(e - b), n)
                      for b, e, n, keep in zip(t.start_ns, t.end_ns, t.name, compute) if keep)
        written = [op for op in kineto_gpu_ops(tmp_path / "py" / f"rank{rank.rank}.json") if "nccl" not in op[2]]
        assert mine == written and len(mine) > 5
        assert len(t.to_dict()["start_ns"]) == len(t)


def test_timeline_on_a_shared_trace_is_consistent(megatron):
    np = pytest.importorskip("numpy")
    r = lumos.replay(megatron)
    t = r.timeline(3)
    assert (t.end_ns >= t.start_ns).all()
    assert len(t) > 1000
    lo, hi = t.window_ns
    assert hi - lo == r.rank(3).simulated_ns
    # An unchanged replay reproduces the measured GPU timeline within the replay's error bound.
    gpu = np.isin(t.kind, [t.kind_names.index("gpu_compute")])
    assert np.abs((t.end_ns - t.start_ns)[gpu] - (t.measured_end_ns - t.measured_start_ns)[gpu]).max() == 0


def cli_error(*args):
    exe = __import__("os").environ.get("LUMOS_CLI")
    if not exe:
        return None
    p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 2
    return p.stderr.strip().removeprefix("lumos: ")


def test_errors_are_exceptions_with_the_cli_message(tmp_path):
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1')
    with pytest.raises(lumos.LumosError) as e:
        lumos.load_job(bad)
    assert str(bad) in str(e.value)
    expected = cli_error("inspect", bad)
    if expected is not None:
        assert str(e.value) == expected
    with pytest.raises(lumos.LumosError, match="no such file or directory"):
        lumos.load_job(tmp_path / "missing")
    assert issubclass(lumos.LumosError, RuntimeError)


def test_bad_scales_and_steps(example_job):
    job = lumos.load_job(example_job)
    with pytest.raises(lumos.LumosError, match="positive factor"):
        lumos.replay(job, scale={"compute": 0})
    with pytest.raises(lumos.LumosError, match="unknown kind"):
        lumos.replay(job, scale={"gpu": 2})
    with pytest.raises(lumos.LumosError, match="no ProfilerStep#99"):
        lumos.replay(job, step=99)


PREDICT = dict(model="gpt3-15b", tp=2, pp=2, dp=2, vp=2, micro_batch=1, recompute="selective", sp=True)


def test_predict_matches_cli(cli):
    p = lumos.predict(**PREDICT)
    theirs = cli("predict", "--model", "gpt3-15b", "--tp", 2, "--pp", 2, "--dp", 2, "--vp", 2, "--micro-batch", 1,
                 "--recompute", "selective", "--sp", "on", "--json")
    mine = p.to_dict()
    mine["graph"].pop("wall_ms")
    theirs["graph"].pop("wall_ms")
    assert mine == theirs
    assert p.iteration_ns == theirs["iteration_ns"] and p.mfu == theirs["mfu"]


def test_predict_tp_comm_overlap_matches_cli(cli):
    p = lumos.predict(**PREDICT, tp_comm_overlap=True)
    theirs = cli("predict", "--model", "gpt3-15b", "--tp", 2, "--pp", 2, "--dp", 2, "--vp", 2, "--micro-batch", 1,
                 "--recompute", "selective", "--sp", "on", "--tp-comm-overlap", "on", "--json")
    assert p.iteration_ns == theirs["iteration_ns"]
    assert theirs["job"]["tp_comm_overlap"] is True
    assert p.iteration_ns < lumos.predict(**PREDICT).iteration_ns


def test_predict_measured_routing_matches_cli(cli):
    # tests/data/moe/loop_unbalanced: 4 experts with 200, 130, 90, 92 token copies; over EP 4 the
    # busiest rank has 200 of a mean 128.
    trace = str(Path(__file__).resolve().parents[1] / "data" / "moe" / "loop_unbalanced")
    moe = dict(model="qwen3-30b-a3b", layers=4, experts=4, top_k=2, expert_ffn=4096, dp=4, ep=4, micro_batch=4,
               global_batch=16, seq=4096)
    p = lumos.predict(**moe, routing="measured", routing_from=trace)
    theirs = cli("predict", "--model", "qwen3-30b-a3b", "--layers", 4, "--experts", 4, "--top-k", 2, "--expert-ffn", 4096,
                 "--dp", 4, "--ep", 4, "--micro-batch", 4, "--global-batch", 16, "--seq", 4096, "--routing", "measured",
                 "--routing-from", trace, "--json")
    assert p.iteration_ns == theirs["iteration_ns"]
    assert p.job["load_imbalance"] == 1.5625
    assert p.iteration_ns > lumos.predict(**moe).iteration_ns
    with pytest.raises(lumos.LumosError, match="needs --routing-from"):
        lumos.predict(**moe, routing="measured")


def taken_options(command, *required):
    """The options `lumos COMMAND` takes, from its error for an unknown one (None without the CLI)."""
    message = cli_error(command, *required, "--no-such-option-of-lumos")
    if message is None:
        pytest.skip("the lumos CLI was not built (LUMOS_CLI unset)")
    return set(re.findall(r"--[a-z0-9-]+", message.split("(this command takes:", 1)[1].split(")", 1)[0]))


@pytest.mark.parametrize("command,known,required,outputs", [
    ("predict", lumos._PREDICT_FLAGS, (), {"--json", "--report"}),
    # sweep refuses the decoder first/last flags (a fixed --pipeline-layout instead)
    ("sweep", lumos._SWEEP_FLAGS, ("--gpus", "8"), {"--json", "--csv", "--report", "--decoder-first-pipeline-num-layers",
                                                    "--decoder-last-pipeline-num-layers"}),
])
def test_every_model_flag_is_a_keyword(command, known, required, outputs):
    assert taken_options(command, *required) - outputs == set(known.values())


def test_predict_cp_fsdp_and_layout_keywords_match_cli(cli):
    base = dict(model="llama3-8b", layers=8, seq=8192, global_batch=16)
    for keywords, flags in ((dict(cp=2, cp_comm="allgather", dp=2), ["--cp", 2, "--cp-comm", "allgather", "--dp", 2]),
                            (dict(fsdp=True, dp=8, hsdp=4, reshard_after_forward=False),
                             ["--fsdp", "on", "--dp", 8, "--hsdp", 4, "--reshard-after-forward", "off"]),
                            (dict(dp=8, distributed_optimizer=False), ["--dp", 8, "--distributed-optimizer", "off"]),
                            (dict(pp=2, pipeline_layout="Et*3|t*5L"), ["--pp", 2, "--pipeline-layout", "Et*3|t*5L"])):
        p = lumos.predict(**base, **keywords)
        theirs = cli("predict", "--model", "llama3-8b", "--layers", 8, "--seq", 8192, "--global-batch", 16, *flags, "--json")
        assert p.iteration_ns == theirs["iteration_ns"], flags
        assert p.to_dict()["memory_bytes_per_gpu"] == theirs["memory_bytes_per_gpu"], flags


def test_predict_errors():
    with pytest.raises(lumos.LumosError) as e:
        lumos.predict(model="gpt3-15b", tp=0)
    expected = cli_error("predict", "--model", "gpt3-15b", "--tp", 0)
    assert str(e.value) == (expected if expected is not None else "--tp must be a positive integer, got '0'")
    with pytest.raises(lumos.LumosError, match="unknown"):
        lumos.predict(model="gpt-99")
    with pytest.raises(TypeError, match="unexpected keyword"):
        lumos.predict(tensor_parallel=8)


def test_predict_with_a_profile_and_the_roofline_matches_cli(cli, tmp_path):
    flags = dict(model="gpt3-15b", tp=2, pp=2, micro_batch=1, forward_only=True, cost_model="roofline")
    mine = lumos.predict(**flags).to_dict()
    theirs = cli("predict", "--model", "gpt3-15b", "--tp", 2, "--pp", 2, "--micro-batch", 1, "--forward-only",
                 "--cost-model", "roofline", "--json")
    mine["graph"].pop("wall_ms")
    theirs["graph"].pop("wall_ms")
    assert mine == theirs


def test_sweep_matches_cli(cli):
    p = lumos.sweep(model="gpt3-15b", gpus=16, tp=[2, 4], pp="1,2", micro_batch=[1, 2], recompute="selective",
                    sp=[True], global_batch=64, top=3, threads=1)
    theirs = cli("sweep", "--model", "gpt3-15b", "--gpus", 16, "--tp", "2,4", "--pp", "1,2", "--micro-batch", "1,2",
                 "--recompute", "selective", "--sp", "on", "--global-batch", 64, "--top", 3, "--threads", 1, "--json")
    assert p.to_dict() == theirs
    assert p.configurations == len(theirs["results"]) and p.accepted == theirs["accepted"]
    assert p.best == theirs["results"][theirs["top"][0]]
    times = [r["iteration_ns"] for r in p.ranked]
    assert times == sorted(times) and len(times) <= 3
    # The same answer on every core as on one.
    assert lumos.sweep(model="gpt3-15b", gpus=16, tp=[2, 4], pp="1,2", micro_batch=[1, 2], recompute="selective",
                       sp=[True], global_batch=64, top=3).to_dict() == theirs
    with pytest.raises(lumos.LumosError, match="--gpus"):
        lumos.sweep(model="gpt3-15b")
    with pytest.raises(TypeError, match="unexpected keyword"):
        lumos.sweep(gpus=8, gpu_count=8)


def test_calibrate_matches_cli(megatron, tmp_path):
    out = tmp_path / "py.json"
    profile = lumos.calibrate(megatron, rank=3, output=out)
    cli_out = tmp_path / "cli.json"
    exe = __import__("os").environ.get("LUMOS_CLI")
    if not exe:
        pytest.skip("the lumos CLI was not built (LUMOS_CLI unset)")
    subprocess.run([exe, "calibrate", megatron, "-o", str(cli_out), "--rank", "3"], check=True, capture_output=True)
    assert out.read_text() == cli_out.read_text()
    assert profile == json.loads(cli_out.read_text())
    assert lumos.predict(model="gpt3-15b", tp=8, micro_batch=1, profile=str(out)).iteration_ns > 0
    with pytest.raises(lumos.LumosError, match="no such rank"):
        lumos.calibrate(megatron, rank=99)


def test_the_gil_is_released_while_replaying(megatron):
    job = lumos.load_job(megatron)
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    worker = threading.Thread(target=count)
    worker.start()
    try:
        time.sleep(0.05)
        start = time.perf_counter()
        before = ticks
        lumos.replay(job)
        lumos.replay(job)
        during = ticks - before
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        worker.join()
    # Holding the GIL for the whole call would leave the counter where it was.
    assert during > 1000, (during, elapsed)


def test_reports_from_python(example_job, tmp_path):
    r = lumos.replay(example_job, scale={"comm": 2}, baseline=True)
    page = Path(r.report(tmp_path / "r.html", title="example <job>")).read_text()
    assert page.startswith("<!DOCTYPE html>") and "example &lt;job&gt;" in page
    assert 'id="card-baseline"' in page and "<script" not in page


def test_pandas_frames(example_job):
    pytest.importorskip("pandas")
    r = lumos.replay(example_job)
    df = r.to_pandas()
    assert df.loc[1, "simulated_ns"] == r.rank(1).simulated_ns
    tl = r.timeline(0).to_pandas()
    assert len(tl) == len(r.timeline(0)) and "processor_name" in tl


# What-ifs of the example job, each as keywords and as the command's flags.
TINY_WHATIFS = [
    (dict(gpu="h200-sxm"), ["--gpu", "h200-sxm"]),
    (dict(dp=4), ["--dp", "4"]),
    (dict(scale={"comm": 2}), ["--scale", "comm=2"]),
    (dict(gpu="a100-sxm-80gb", scale={"op:gemm": 0.8}), ["--gpu", "a100-sxm-80gb", "--scale", "op:gemm=0.8"]),
    (dict(gpu="h200-sxm", host_speed=1.25), ["--gpu", "h200-sxm", "--host-speed", "1.25"]),
]


@pytest.mark.parametrize("keywords,flags", TINY_WHATIFS)
def test_whatif_matches_cli_on_the_example_job(example_job, cli, keywords, flags):
    w = lumos.whatif(example_job, **keywords)
    theirs = cli("whatif", example_job, *flags, "--json")
    assert w.to_dict() == theirs
    assert w.changes == theirs["change_records"] and w.change_texts == theirs["changes"]
    assert (w.baseline_ns, w.iteration_ns, w.speedup) == (theirs["baseline"]["iteration_ns"], theirs["predicted"]["iteration_ns"],
                                                          theirs["speedup"])
    assert all({"pass", "subject", "from", "to", "figures", "text"} <= set(c) for c in w.changes)
    assert (w.bound_by, w.critical_path_shares, w.attribution) == (theirs["bound_by"], theirs["critical_path_shares"],
                                                                   theirs["attribution"])


# The parallelism, precision and MoE keywords on the hand-made traces of tests/data, as the flags.
DATA_WHATIFS = [
    ("cp/te_cp2", dict(cp=4), ["--cp", "4"]),
    ("fsdp/fsdp2_shard2", dict(fsdp=True, dp=4), ["--fsdp", "on", "--dp", "4"]),
    ("fsdp/fsdp2_shard2", dict(reshard_after_forward=False), ["--reshard-after-forward", "off"]),
    ("moe/ep2_grouped_splits", dict(ep=1), ["--ep", "1"]),
    ("moe/ep2_grouped_splits", dict(top_k=1, routing="balanced"), ["--top-k", "1", "--routing", "balanced"]),
]


@pytest.mark.parametrize("data,keywords,flags", DATA_WHATIFS)
def test_whatif_keywords_are_the_flags(cli, data, keywords, flags):
    path = Path(__import__("os").environ.get("LUMOS_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "tests" / "data" / data
    assert lumos.whatif(path, **keywords).to_dict() == cli("whatif", path, *flags, "--json")


def test_whatif_fsdp_and_precision_errors_are_the_cli_messages(example_job):
    for keywords, flags in ((dict(hsdp=2), ["--hsdp", 2]), (dict(precision="fp4"), ["--precision", "fp4"]),
                            (dict(fsdp="maybe"), ["--fsdp", "maybe"])):
        with pytest.raises(lumos.LumosError) as e:
            lumos.whatif(example_job, **keywords)
        expected = whatif_cli_error(example_job, *flags)
        assert expected is None or str(e.value) == expected, flags


def test_whatif_replays_are_replays(megatron, cli):
    np = pytest.importorskip("numpy")
    job = lumos.load_job(megatron)
    w = lumos.whatif(job, tp=4)
    theirs = cli("whatif", megatron, "--tp", 4, "--json")
    assert w.to_dict() == theirs
    assert w.structure == cli("inspect", megatron, "--structure", "--json")
    # The baseline is the replay of the traces; the prediction's rows are the JSON's.
    assert_same_replay(w.baseline, cli("replay", megatron, "--json"))
    assert w.predicted.simulated_ns == theirs["predicted"]["iteration_ns"]
    rows = {r["rank"]: r for r in theirs["predicted"]["ranks"]}
    for rank, row in zip(w.predicted.ranks, w.predicted.breakdowns()):
        assert row.tolist() == [rows[rank.rank]["breakdown"][c] for c in lumos.BREAKDOWN_COLUMNS]
    t = w.predicted.timeline(w.predicted.ranks[0].rank)
    assert isinstance(t.start_ns, np.ndarray) and len(t) > 1000 and (t.end_ns >= t.start_ns).all()


def test_whatif_pipeline_split_writes_the_cli_traces_and_page(cli, tmp_path):
    source = Path(__import__("os").environ.get("LUMOS_SOURCE_DIR", Path(__file__).resolve().parents[2]))
    job = source / "tests" / "data" / "gpu" / "h100-base"
    w = lumos.whatif(job, pp=2, step=1)
    theirs = cli("whatif", job, "--pp", 2, "--step", 1, "--json", "--trace-out", tmp_path / "cli", "--report", tmp_path / "cli.html")
    files = theirs.pop("trace_out")
    assert w.to_dict() == theirs and w.pipeline["model"] == "graph"
    # Every rank of every stage, byte for byte the command's files.
    mine = w.predicted.write_trace(tmp_path / "py")
    assert [Path(f).name for f in mine] == [Path(f).name for f in files if f.endswith(".json")] and len(mine) == 2
    for f in mine:
        assert Path(f).read_bytes() == (tmp_path / "cli" / Path(f).name).read_bytes()
    assert [r.rank for r in w.predicted.ranks] == [r["rank"] for r in theirs["predicted"]["ranks"]]
    # The what-if page is the command's: the changes first, the baseline beside the prediction.
    page = Path(w.report(tmp_path / "py.html")).read_text()
    assert page == (tmp_path / "cli.html").read_text()
    assert 'id="card-baseline"' in page


def test_whatif_pass_level_pipeline_matches_cli_and_writes_no_traces(cli, tmp_path):
    source = Path(__import__("os").environ.get("LUMOS_SOURCE_DIR", Path(__file__).resolve().parents[2]))
    job = source / "tests" / "data" / "whatif" / "pp2_1f1b"
    w = lumos.whatif(job, schedule="gpipe")
    assert w.to_dict() == cli("whatif", job, "--schedule", "gpipe", "--json")
    assert w.pipeline["model"] == "pass-level" and w.predicted.simulated_ns == w.iteration_ns
    with pytest.raises(lumos.LumosError) as e:
        w.write_trace(tmp_path / "out")
    expected = whatif_cli_error(job, "--schedule", "gpipe", "--trace-out", tmp_path / "cli")
    assert str(e.value).startswith("--trace-out: the pipeline change was predicted by the pass-level model")
    assert expected is None or str(e.value) == expected
    assert not (tmp_path / "out").exists()

def synth_unfolded(tmp_path):
    exe = __import__("os").environ.get("LUMOS_CLI")
    if not exe:
        pytest.skip("the lumos CLI was not built (LUMOS_CLI unset)")
    out = tmp_path / "job"
    # Four data-parallel ranks with identical traces.
    subprocess.run([exe, "synth", "--model", "gpt3-15b", "--layers", "2", "--hidden", "1024", "--heads", "8", "--seq", "1024",
                    "--dp", "4", "--micro-batch", "1", "--global-batch", "8", "--unfold", "--out", str(out)],
                   check=True, capture_output=True)
    return out


def test_whatif_folds_identical_ranks_as_the_cli(cli, tmp_path):
    job = lumos.load_job(synth_unfolded(tmp_path))
    assert len(job) == 4
    folded = lumos.whatif(job, dp=8)
    assert folded.to_dict() == cli("whatif", *job.paths, "--dp", 8, "--json")
    assert folded.folded["traced_ranks"] == 4 and folded.folded["replayed_ranks"] < 4
    assert len(job) == 4  # the loaded job keeps every rank
    whole = lumos.whatif(job, dp=8, fold=False)
    assert whole.to_dict() == cli("whatif", *job.paths, "--dp", 8, "--no-fold", "--json")
    assert whole.folded is None and whole.iteration_ns == folded.iteration_ns
    with pytest.raises(lumos.LumosError, match="fold=False"):
        folded.write_trace(tmp_path / "folded")
    assert len(whole.write_trace(tmp_path / "whole")) == 4


def whatif_cli_error(*args):
    """The first line of the command's message (a usage error is followed by the usage)."""
    expected = cli_error("whatif", *args)
    return None if expected is None else expected.removeprefix("lumos whatif: ").split("\n")[0]


def test_whatif_errors_are_the_cli_messages(example_job):
    for keywords, flags in ((dict(), []), (dict(tp=0), ["--tp", 0]), (dict(gpu="h999"), ["--gpu", "h999"]),
                            (dict(layers=4), ["--layers", 4]), (dict(scale={"gpu": 2}), ["--scale", "gpu=2"])):
        with pytest.raises(lumos.LumosError) as e:
            lumos.whatif(example_job, **keywords)
        expected = whatif_cli_error(example_job, *flags)
        assert expected is None or str(e.value) == expected, flags
    with pytest.raises(lumos.LumosError, match="^whatif needs a change"):
        lumos.whatif(example_job)
    with pytest.raises(TypeError):
        lumos.whatif(example_job, tensor_parallel=2)


def test_inspect_structure_matches_cli(megatron, example_job, cli):
    job = lumos.load_job(megatron)
    assert job.inspect(structure=True) == cli("inspect", megatron, "--structure", "--json")
    assert job.inspect(structure=True, groups=True) == cli("inspect", megatron, "--structure", "--groups", "--json")
    assert lumos.load_job(example_job).inspect(structure=True) == cli("inspect", example_job, "--structure", "--json")

def test_the_example_notebook_runs(tmp_path):
    np = pytest.importorskip("numpy")  # noqa: F841
    import os
    import sys
    script = Path(os.environ.get("LUMOS_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "examples" / "python" / "replay_notebook.py"
    out = subprocess.run([sys.executable, str(script), "--report", str(tmp_path / "r.html")], capture_output=True, text=True,
                         check=True).stdout
    assert "critical path of rank" in out and (tmp_path / "r.html").is_file()
    assert "lumos.WhatIf(" in out and (tmp_path / "whatif-r.html").is_file()


def test_unprofiled_step_matches_cli_and_is_shorter_when_host_bound(cli):
    # A host-bound recorded run (tests/data/gpu): the profiler's host time is a large part of its step.
    run = Path(__file__).resolve().parents[1] / "data" / "gpu" / "h100-small-l8"
    job = lumos.load_job(run)
    r = lumos.replay(job)
    theirs = cli("replay", run, "--json")
    assert r.unprofiled_ns == theirs["job"]["unprofiled_ns"]
    assert r.to_dict()["job"]["unprofiled_ns"] == r.unprofiled_ns
    assert 0 < r.unprofiled_ns < 0.9 * r.simulated_ns
    w = lumos.whatif(job, layers=16)
    mine = cli("whatif", run, "--layers", 16, "--json")
    assert (w.baseline_unprofiled_ns, w.unprofiled_ns) == (mine["baseline"]["unprofiled_ns"], mine["predicted"]["unprofiled_ns"])
    assert w.baseline_unprofiled_ns == r.unprofiled_ns
    assert w.baseline.unprofiled_ns == r.unprofiled_ns and w.predicted.unprofiled_ns == w.unprofiled_ns
    assert w.baseline_unprofiled_ns < w.unprofiled_ns <= w.iteration_ns
