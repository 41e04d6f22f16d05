from bench.mixes import Kind, MixSpec, kind_of, make_mix, spec_for
from bench.placement import ReplayResult, TraceNode, TraceTask
from bench.report import Case, Paired, leave_one_out, tally

NODES = [TraceNode(f"n{i}", 64000, 262144, 8, model) for i, model in enumerate(["T4", "T4", "V100M16", "V100M32"])]
TASKS = [
    TraceTask("share", 4000, 8192, 1, 500, None),
    TraceTask("one", 4000, 8192, 1, 1000, None),
    TraceTask("multi", 8000, 8192, 4, 1000, None),
    TraceTask("cpu", 2000, 4096, 0, 0, None),
]


def test_a_mix_draws_the_kinds_in_its_shares_and_binds_only_models_of_its_cluster() -> None:
    spec = MixSpec(share=0.5, multi=0.0, cpu=0.5, constrained=1.0, cluster=0.5)
    mix = make_mix(3, NODES, TASKS, spec)
    kinds = [kind_of(t) for t in mix.tasks]
    assert set(kinds) == {Kind.SHARE, Kind.CPU}
    assert 0.45 < kinds.count(Kind.SHARE) / len(kinds) < 0.55
    models = {n.model for n in mix.nodes}
    assert len(mix.nodes) == 2
    assert all(t.gpu_spec and t.gpu_spec <= models for t in mix.tasks if t.num_gpu)
    assert all(t.gpu_spec is None for t in mix.tasks if not t.num_gpu)
    assert make_mix(3, NODES, TASKS, spec) == mix


def test_mix_specs_are_valid_and_differ() -> None:
    specs = [spec_for(i) for i in range(20)]
    assert len(set(specs)) == 20
    assert all(s.one >= 0 for s in specs)


def case(name: str, unallocated: dict[str, float]) -> Case:
    def run(policy: str, value: float) -> ReplayResult:
        return ReplayResult(policy, 0, 100.0, 100.0 - value, 0, 0, (1.0,))

    return Case(name, "", 100.0, {p: [run(p, v)] for p, v in unallocated.items()})


def test_leave_one_out_chooses_on_the_other_lists_and_judges_on_the_held_out_one() -> None:
    cases = [
        case("a", {"fgd": 10, "x": 5, "y": 9}),
        case("b", {"fgd": 10, "x": 5, "y": 9}),
        case("c", {"fgd": 10, "x": 20, "y": 1}),
    ]
    rows = {r["held_out"]: r for r in leave_one_out(cases, ["x", "y"])}
    assert rows["c"]["chosen"] == "x" and rows["c"]["vs_fgd"] == 1.0
    assert rows["a"]["chosen"] == "y"
    t = tally(cases, "x")
    assert (t["wins"], t["ties"], t["losses"]) == (2, 0, 1)
    assert tally([case("d", {"fgd": 10, "x": 10.2})], "x")["ties"] == 1


def test_a_paired_difference_is_shown_only_when_its_interval_leaves_out_zero() -> None:
    steady = Paired.of([1.0, 2.0, 3.0, 4.0])  # worse on every seed
    assert steady.mean == 2.5 and round(steady.low, 2) == 0.45 and round(steady.high, 2) == 4.55
    assert steady.verdict == "worse"
    assert Paired.of([-1.0, 1.0, -1.0, 1.5]).verdict == "not shown"  # seed noise
    assert Paired.of([-3.0, -3.0, -3.0]).verdict == "better"  # the same on every seed: no spread at all
    assert Paired.of([5.0]).verdict == "not shown"  # one seed proves nothing


def test_seeds_are_paired_by_arrival_order() -> None:
    def run(policy: str, seed: int, value: float) -> ReplayResult:
        return ReplayResult(policy, seed, 100.0, 100.0 - value, 0, 0, (1.0,))

    # Spread over seeds hides it (means 15 and 16, sd 5), but x is one GPU worse on each seed.
    fgd = [run("fgd", s, v) for s, v in enumerate([10.0, 15.0, 20.0])]
    x = [run("x", s, v + 1.0) for s, v in enumerate([10.0, 15.0, 20.0])]
    paired = Case("m", "", 100.0, {"fgd": fgd, "x": x}).paired("x")
    assert paired.mean == 1.0 and paired.verdict == "worse"
