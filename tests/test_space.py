"""Search spaces: the expression allow-list, loading, counting and enumeration, device limits, occupancy,
the seeds, config parsing, and the optuna bridge. No GPU."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import random
from pathlib import Path

import pytest
import yaml

from autotile.codegen import resources
from autotile.codegen.expr import FUNCTIONS, Expr
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import DEVICE_CONSTRAINTS, Config, Problem, Space, load_space
from autotile.errors import InfeasibleConfigError, InvalidValueError, SpaceDefinitionError, UnknownNameError

SEEDS = [("matmul", "seed-naive", "row"), ("matmul", "seed-tiled16", "row"), ("matmul", "seed-tiled32", "row"),
         ("matvec", "seed-matvec-colmajor", "col")]
DTYPES = ("float32", "float64")


@pytest.fixture(scope="module")
def matmul() -> Space:
    return load_space("matmul")


@pytest.fixture(scope="module")
def matvec() -> Space:
    return load_space("matvec")


@functools.lru_cache(maxsize=None)
def _shipped(kernel: str) -> Space:
    return load_space(kernel)


def spaces() -> dict[str, Space]:
    """The shipped spaces, loaded once (a load parses the YAML: a tenth of a second, and some thirty tests ask):
    the tests only read them."""
    return {"matmul": _shipped("matmul"), "matvec": _shipped("matvec")}


def problem(profile: str = "h100", dtype: str = "float32", layout: str = "row") -> Problem:
    return Problem(PROFILES[profile], dtype, layout)


def raw(kernel: str) -> dict:
    return yaml.safe_load(resources.search_space_path(kernel).read_text())


@functools.lru_cache(maxsize=None)
def _prefixes(space: Space) -> dict[str, str]:
    """How `violations()` starts the line of each constraint, by its name (made once per space: the
    brute-force tests below ask of thousands of points)."""
    prefixes = {c.name: f"breaks '{c.name}' ({c.expr.text}) with " for c in space.constraints}
    assert len(prefixes) == len(space.constraints)  # names are distinct: a line names one constraint
    return prefixes


def failed(space: Space, config: Config, prob: Problem) -> list[str]:
    """The names of the constraints a config breaks, parsed from `violations()`."""
    names = []
    prefixes = _prefixes(space)
    for line in space.violations(config, prob):
        # "breaks 'NAME' (EXPR) with ...": NAME may hold quotes, so try every "' (" as its end
        match, end = [], line.find("' (")
        while end != -1:
            name = line[8:end]
            if name in prefixes and line.startswith(prefixes[name]):
                match.append(name)
            end = line.find("' (", end + 1)
        assert line.startswith("breaks '") and len(match) == 1, line
        names.append(match[0])
    return names


# -- expressions -----------------------------------------------------------------------------------

UNSAFE = [
    ("().__class__", "Attribute"),
    ("BM.bit_length()", "only calls"),  # the call is met first: its callee is not a bare allowed name
    ("__import__('os').system('true')", "only calls"),
    ("__import__('os')", "only calls"),
    ("lambda: 1", "Lambda"),
    ("(lambda x: x)(1)", "only calls"),
    ("BM[0]", "Subscript"),
    ("'abc'[1:]", "Subscript"),
    ("open('/etc/passwd')", "only calls"),
    ("eval('1')", "only calls"),
    ("getattr(BM, 'real')", "only calls"),
    ("len([1, 2])", "only calls"),
    ("max(BM, key=abs)", "only calls"),  # keyword arguments are refused too
    ("max(*[1, 2])", "Starred"),
    ("[x for x in (1, 2)]", "ListComp"),
    ("{1: 2}", "Dict"),
    ("f'{BM}'", "JoinedStr"),
    ("(y := 3)", "NamedExpr"),
    ("min(1, 2)(3)", "only calls"),  # the callee must be a bare allowed name
    ("BM +", "cannot parse"),
]


@pytest.mark.parametrize("text,why", UNSAFE, ids=[t for t, _ in UNSAFE])
def test_expr_rejects_unsafe_text(text, why):
    with pytest.raises(SpaceDefinitionError) as info:
        Expr(text, "test")
    assert why in str(info.value)
    assert str(info.value).startswith("test: ")


def test_expr_accepts_the_allowed_language_and_evaluates_it():
    e = Expr("ceil_div(a, 8) * 8 + max(b, 2) if layout == 'row' and not flag else -1", "ok")
    assert e.names == {"a", "b", "layout", "flag"}  # the functions are not names the space must supply
    assert e({"a": 33, "b": 1, "layout": "row", "flag": False}) == 42
    assert e({"a": 33, "b": 1, "layout": "col", "flag": False}) == -1
    assert Expr("x in (1, 2) and y not in [3]")({"x": 2, "y": 4}) is True
    assert Expr("is_pow2(n) and floor(n / 3) == 5 and abs(-n) == 16 and int(2.5) == 2")({"n": 16}) is True


def test_expr_evaluates_without_builtins():
    # A bare name passes the parser (the space then checks it is known), but no builtin is reachable.
    with pytest.raises(NameError):
        Expr("len")({})
    with pytest.raises(NameError):
        Expr("print")({})


# -- loading ---------------------------------------------------------------------------------------

def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['kernel']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_shipped_space_loads_through_a_file_copy(tmp_path):
    # The control for the failures below: an unchanged copy loads.
    space = Space.load(_write(tmp_path, raw("matmul")))
    assert list(space.params) == list(load_space("matmul").params)


@pytest.mark.parametrize("where", ["constraint", "derived"])
def test_space_with_unknown_name_fails_to_load(tmp_path, where):
    data = raw("matmul")
    if where == "constraint":
        data["constraints"].append({"name": "typo", "expr": "BM % BX == 0"})
    else:
        data["derived"]["wasted"] = "BM * BZZ"
    with pytest.raises(SpaceDefinitionError) as info:
        Space.load(_write(tmp_path, data))
    assert ("BX" if where == "constraint" else "BZZ") in str(info.value)
    assert "unknown names" in str(info.value)


def test_space_with_unsafe_expression_fails_to_load(tmp_path):
    data = raw("matvec")
    data["constraints"].append({"name": "evil", "expr": "__import__('os').getcwd() != ''"})
    with pytest.raises(SpaceDefinitionError, match="evil"):
        Space.load(_write(tmp_path, data))


def test_space_definition_errors(tmp_path):
    data = raw("matmul")
    del data["params"]["smem"]
    with pytest.raises(SpaceDefinitionError, match="smem"):
        Space(data)
    data = raw("matmul")
    del data["derived"]["smem_bytes"]
    data["derived"]["loads_per_thread"] = "0"
    with pytest.raises(SpaceDefinitionError, match="smem_bytes"):
        Space(data)
    data = raw("matmul")
    data["default"] = "no-such-config"
    with pytest.raises(SpaceDefinitionError, match="no-such-config"):
        Space(data)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kernel: [unclosed\n")
    with pytest.raises(SpaceDefinitionError, match="not valid YAML"):
        Space.load(bad)


# -- counting and enumeration ----------------------------------------------------------------------

# matmul's count walks the whole product (seconds a case on CI's cores): each dtype on one profile, the two
# profiles between them; matvec's every combination.
COUNT_CASES = [("matmul", "row", "float32", "p100"), ("matmul", "row", "float64", "h100")] + [
    ("matvec", lay, dt, prof) for lay in ("row", "col") for dt in DTYPES for prof in ("p100", "h100")]


@pytest.mark.parametrize("kernel,layout,dtype,profile", COUNT_CASES)
def test_count_accounts_for_every_point(kernel, layout, dtype, profile):
    space = spaces()[kernel]
    prob = problem(profile, dtype, layout)
    c = space.count(prob)
    product = 1
    for p in space.params.values():
        product *= len(p.choices)
    assert c.total == product
    assert 0 < c.feasible < c.total
    assert set(c.excluded_by) == {con.name for con in space.constraints}
    assert all(n >= 0 for n in c.excluded_by.values())
    assert c.feasible + sum(c.excluded_by.values()) == c.total

    first = space.feasible(prob, limit=300)
    assert len(first) == 300 and len(set(first)) == 300
    # The feasible share of matmul's product is under 1e-5 on a P100: the few rejection draws allowed here
    # fall short, and the enumeration supplies the rest (both paths are checked below).
    drawn = space.sample(prob, 80, seed=7, max_draws=20_000)
    assert len(drawn) == 80 and len(set(drawn)) == 80
    for cfg in first + drawn:
        assert list(cfg) == list(space.params)
        assert space.violations(cfg, prob) == []
        assert space.is_feasible(cfg, prob)
        space.check(cfg, prob)  # does not raise

    # Uniform random points of the whole product: most are infeasible and each of those names a reason.
    rng = random.Random(11)
    infeasible = 0
    for _ in range(300):
        cfg = space.config({p.name: rng.choice(p.choices) for p in space.params.values()})
        broken = failed(space, cfg, prob)
        assert space.is_feasible(cfg, prob) == (not broken)
        if broken:
            infeasible += 1
            assert set(broken) <= set(c.excluded_by)
            with pytest.raises(InfeasibleConfigError, match="infeasible on"):
                space.check(cfg, prob)
    assert infeasible > 100


def test_sample_completes_from_the_enumeration(matvec):
    """Where rejection draws fall short (none allowed here), the enumeration supplies distinct feasible configs,
    seeded; asking for more than there are gives every one."""
    prob = problem("a100", "float64", "row")
    drawn = matvec.sample(prob, 25, seed=3, max_draws=0)
    assert len(drawn) == 25 and len(set(drawn)) == 25 and all(matvec.is_feasible(c, prob) for c in drawn)
    assert drawn == matvec.sample(prob, 25, seed=3, max_draws=0) != matvec.sample(prob, 25, seed=4, max_draws=0)
    narrow = matvec.restricted({"ROWS": [4], "THREADS_K": [8], "SPLIT_K": [1]})
    every = narrow.feasible(prob)
    assert 0 < len(every) < 500 and set(narrow.sample(prob, 10_000, seed=1, max_draws=50)) == set(every)


def test_matvec_feasible_list_matches_count(matvec):
    prob = problem("a100", "float64", "row")
    everything = matvec.feasible(prob)
    assert len(everything) == matvec.count(prob).feasible
    assert len(set(everything)) == len(everything)
    assert matvec.feasible(prob, limit=10) == everything[:10]


def _reduced(kernel: str, keep: dict[str, list]) -> Space:
    data = copy.deepcopy(raw(kernel))
    for name, choices in keep.items():
        data["params"][name]["choices"] = choices
    data["configs"] = {}
    data.pop("default", None)
    return Space(data, f"reduced {kernel}")



# The matmul space with its tile and warp shapes and stages free again: thousands of feasible points, and
# levels both with and without counts memoized (`_Step.subtree_key`).
MIDDLE_MATMUL = ("BM", "BN", "TM", "TN", "BK", "STAGES", "WM", "WN")


@pytest.mark.parametrize("kernel,profile,dtype,layout,n,seed", [("matvec", "a100", "float64", "row", 37, 5),
                                                                ("matmul", "h100", "float32", "nn", 23, 2),
                                                                ("matmul", "p100", "float64", "nn", 400, 9),
                                                                ("matmul", "a100", "bfloat16", "nt", 1000, 4)])
def test_enumerated_draws_are_the_positions_of_the_walk(kernel, profile, dtype, layout, n, seed):
    """The configs the enumeration supplies (`sample` with no rejection draws) are those at the positions its
    seeded draw picks in the walk's order, reached through the subtrees' counts (passed over, or walked where
    a level below has no counts to skip by): compared with the positions in the whole feasible list, before
    and after the problem's count is kept."""
    keep = {name: choices for name, choices in REDUCED[kernel].items() if name not in MIDDLE_MATMUL}
    space = _reduced(kernel, keep)
    prob = problem(profile, dtype, layout)
    every = space.feasible(prob)
    rng = random.Random(seed)
    expected = [every[i] for i in sorted(rng.sample(range(len(every)), min(n, len(every))))]
    rng.shuffle(expected)
    assert len(every) > n and space.sample(prob, n, seed=seed, max_draws=0) == expected
    assert space.count(prob).feasible == len(every)
    assert space.sample(prob, n, seed=seed, max_draws=0) == expected

REDUCED = {
    # Both choices of the wgmma knobs and of STORE kept, the warp tile cut to one shape, the stages to
    # a cp.async depth and a TMA-only one, the mma depth, VEC and the knobs that only K splits or a launch
    # order (fixed here) make feasible to one: the brute force checks every point twice (some 190 thousand
    # here, ten seconds a case). PAD is cut to one value to pay for NARROW_COPIES's two (with VEC 1, its constraint
    # prunes it wherever it is active); REALIGN to false (with VEC 1 its constraint prunes it too).
    "matmul": {"BM": [16, 256], "BN": [16, 128], "TM": [1, 8], "TN": [1, 4], "BK": [8, 64], "VEC": [1],
               "PAD": [0], "SPLIT_K": [1], "SWIZZLE": [1], "UNROLL": ["full"], "WM": [32], "WN": [32],
               "MMA_K": [8], "THREADS_K": [1], "STEPS": [1], "STAGES": [2, 5], "PERSISTENT": [False],
               "SPLIT_REDUCE": ["atomic"], "CLUSTER_M": [1], "REALIGN": [False]},
    "matvec": {"ROWS": [1, 4, 32, 512], "THREADS_K": [1, 8, 64, 256], "TILE_K": [16, 256, 2048],
               "SPLIT_K": [1], "UNROLL": [1]},
}


def _breaks(space: Space, prob: Problem):
    """`config -> the names of the constraints it breaks`, as `failed` reads them from `violations()`, made once
    for many configs: the same evaluation (every derived quantity in order, then every constraint, in the
    scope of the functions, the problem and the config) without the lines `violations()` writes for each
    broken constraint and `failed` parses again, which took half the time of the brute force below."""
    base = dict(FUNCTIONS)
    base.update(prob.names())
    derived = list(space.derived.items())
    constraints = [(c.name, c.expr) for c in space.constraints]

    def breaks(config) -> list[str]:
        scope = dict(base)
        scope.update(config)
        for name, expr in derived:
            scope[name] = expr.eval_in(scope)
        return [name for name, expr in constraints if not expr.eval_in(scope)]

    return breaks


@pytest.mark.parametrize("kernel,layout,dtype,profile", [
    ("matmul", "row", "float32", "p100"), ("matmul", "row", "float64", "h100"),
    ("matvec", "row", "float32", "l4"), ("matvec", "col", "float64", "p100"), ("matvec", "col", "float32", "h100")])
def test_pruned_enumeration_equals_brute_force(kernel, layout, dtype, profile):
    """The depth-first walk prunes whole subtrees; it must find exactly the points that pass every check."""
    space = _reduced(kernel, REDUCED[kernel])
    prob = problem(profile, dtype, layout)
    c = space.count(prob)
    # Every point of the product, checked once each way and not kept (the matmul product has some 190
    # thousand): `is_feasible`'s check (`feasibility`, made once rather than once a point) and the
    # constraints it breaks (`_breaks`, which says what `failed` says: compared on every 50th point).
    is_feasible, breaks = space.feasibility(prob), _breaks(space, prob)
    names = list(space.params)
    good = []
    # Each infeasible point is charged to one constraint it really breaks: no constraint is charged with
    # more points than break it.
    breaking = {name: 0 for name in c.excluded_by}
    points = 0
    for points, values in enumerate(itertools.product(*(p.choices for p in space.params.values())), 1):
        cfg = dict(zip(names, values, strict=True))
        broken, ok = breaks(cfg), is_feasible(cfg)
        assert ok == (not broken), cfg  # the walk's compiled check against each expression evaluated alone
        if ok:
            good.append(Config(cfg))
        if points % 50 == 1:
            assert broken == failed(space, Config(cfg), prob), cfg
        for name in set(broken):
            breaking[name] += 1
    assert 0 < len(good) < points
    assert space.feasible(prob) == good  # same set, same (declared) order
    assert (c.total, c.feasible) == (points, len(good))
    for name, n in c.excluded_by.items():
        assert n <= breaking[name], name
    assert sum(c.excluded_by.values()) == points - len(good)


# -- device limits ---------------------------------------------------------------------------------

def _matmul_cfg(space: Space, **values) -> Config:
    return space.with_overrides(space.named("seed-tiled16"), values)


def test_static_smem_over_48k_is_infeasible(matmul):
    cfg = _matmul_cfg(matmul, smem="static", BM=128, BN=128, TM=8, TN=8, BK=32, VEC=4, A_TRANSPOSED=True,
                      PAD=4, STAGES=2)
    smem = matmul.derive(cfg, problem("p100"))["smem_bytes"]
    assert smem == 2 * (32 * 132 + 32 * 132) * 4 > 48 * 1024
    for profile in ("p100", "h100"):  # the 48 KB static cap holds on every device
        assert "static shared memory per block" in failed(matmul, cfg, problem(profile))
        with pytest.raises(InfeasibleConfigError, match="static shared memory per block"):
            matmul.check(cfg, problem(profile))
    # The same tiles as dynamic shared memory fit the H100's opt-in limit.
    dyn = matmul.with_overrides(cfg, {"smem": "dynamic"})
    assert matmul.is_feasible(dyn, problem("h100"))
    assert "dynamic shared memory per block (opt-in)" in failed(matmul, dyn, problem("p100"))


def test_dynamic_smem_between_p100_and_h100_optin(matmul):
    cfg = _matmul_cfg(matmul, smem="dynamic", BM=128, BN=128, TM=8, TN=8, BK=32, VEC=4, A_TRANSPOSED=True,
                      PAD=4, STAGES=2)
    smem = matmul.derive(cfg, problem("h100"))["smem_bytes"]
    assert PROFILES["p100"].optin_smem_per_block == 48 * 1024 < smem <= PROFILES["h100"].optin_smem_per_block
    assert PROFILES["h100"].optin_smem_per_block == 227 * 1024
    assert "dynamic shared memory per block (opt-in)" in failed(matmul, cfg, problem("p100"))
    assert not matmul.is_feasible(cfg, problem("p100"))
    assert matmul.violations(cfg, problem("h100")) == []
    # As static shared memory the same tiles break the 48 KB cap even on the H100.
    static = matmul.with_overrides(cfg, {"smem": "static"})
    assert failed(matmul, static, problem("h100")) == ["static shared memory per block"]


def test_smem_just_at_the_static_cap_is_feasible(matmul):
    # 2 stages of A (64 x (32 + 0)) and B (32 x (64 + 0)) floats: 2 * 4096 * 4 bytes = 32 KB; float64: 64 KB.
    cfg = _matmul_cfg(matmul, smem="static", BM=64, BN=64, TM=4, TN=4, BK=32, VEC=4, STAGES=2)
    assert matmul.derive(cfg, problem())["smem_bytes"] == 32 * 1024
    assert matmul.is_feasible(cfg, problem("p100"))
    cfg = _matmul_cfg(matmul, smem="static", BM=64, BN=128, TM=8, TN=4, BK=32, VEC=4, STAGES=1, PAD=0)
    smem = matmul.derive(cfg, problem())["smem_bytes"]
    assert smem == (64 * 32 + 32 * 128) * 4 == 24 * 1024
    assert matmul.is_feasible(cfg, problem("p100", "float32"))
    assert matmul.derive(cfg, problem("p100", "float64"))["smem_bytes"] == 48 * 1024  # exactly the cap
    assert "static shared memory per block" not in failed(matmul, cfg, problem("p100", "float64"))


def test_more_than_1024_threads_is_infeasible(matmul, matvec):
    cfg = _matmul_cfg(matmul, smem="none", BM=64, BN=64, TM=1, TN=2)
    assert matmul.derive(cfg, problem())["threads"] == 2048
    assert failed(matmul, cfg, problem())[0] == "threads per block"
    with pytest.raises(InfeasibleConfigError, match="threads per block"):
        matmul.check(cfg, problem())
    ok = matmul.with_overrides(cfg, {"TN": 4})
    assert matmul.derive(ok, problem())["threads"] == 1024 and matmul.is_feasible(ok, problem())
    mv = matvec.with_overrides(matvec.named("warp-per-row"), {"ROWS": 64})
    assert matvec.derive(mv, problem())["threads"] == 2048
    assert "threads per block" in failed(matvec, mv, problem())


def test_check_reports_every_broken_rule_structural_first(matmul):
    # Breaks a structural rule of the space (BK=32 without shared memory) and a device limit (2048 threads).
    cfg = _matmul_cfg(matmul, smem="none", BM=64, BN=64, TM=1, TN=2, BK=32)
    names = failed(matmul, cfg, problem())
    assert names == ["BK only where smem != 'none' and MATH != 'skinny'", "threads per block", "registers per block"]
    with pytest.raises(InfeasibleConfigError) as info:
        matmul.check(cfg, problem("v100"))
    assert str(info.value) == (
        "matmul config is infeasible on Tesla V100 (float32): "
        "breaks 'BK only where smem != 'none' and MATH != 'skinny'' "
        "((smem != 'none' and MATH != 'skinny') or BK == 16) with BK=32, MATH=simt, smem=none; "
        "breaks 'threads per block' (threads <= max_threads_per_block) with max_threads_per_block=1024, threads=2048; "
        "breaks 'registers per block' (regs_per_block <= regs_per_block_limit) with regs_per_block=98304, "
        "regs_per_block_limit=65536")


def test_check_names_the_structural_cause_next_to_a_device_limit(matmul):
    """tf32x3 on a P100: the tile also overflows its shared memory, but the cause is the architecture."""
    cfg = matmul.named("tf32x3-128")
    names = failed(matmul, cfg, problem("p100"))
    assert names == ["tf32x3 on float32 and sm_80 or newer", "dynamic shared memory per block (opt-in)"]
    with pytest.raises(InfeasibleConfigError) as info:
        matmul.check(cfg, problem("p100"))
    message = str(info.value)
    assert message.startswith("matmul config is infeasible on Tesla P100 (float32): "
                              "breaks 'tf32x3 on float32 and sm_80 or newer' (")
    assert all(f"breaks '{name}' (" in message for name in names) and message.count("; breaks '") == 1
    assert "cc=60" in message and "smem_bytes=62208" in message and "\n" not in message


def test_register_limits(matmul):
    cfg = _matmul_cfg(matmul, smem="none", BM=64, BN=64, TM=16, TN=8)
    d32, d64 = (matmul.derive(cfg, problem(dtype=dt))["regs_per_thread"] for dt in DTYPES)
    assert d32 == 16 * 8 + 16 + 8 + 40 and d64 == 2 * (16 * 8 + 16 + 8) + 40
    assert matmul.is_feasible(cfg, problem(dtype="float32"))
    assert "registers per thread" in failed(matmul, cfg, problem(dtype="float64"))


def test_occupancy_of_seed_tiled16_on_h100(matmul):
    d = matmul.derive(matmul.named("seed-tiled16"), problem("h100"))
    assert d["threads"] == 256
    assert d["smem_bytes"] == 2 * 16 * 16 * 4
    assert d["regs_per_thread"] == 1 + 1 + 1 + 2 + 40  # acc, fragments, 2 staged elements, overhead
    assert d["regs_per_block"] == 48 * 256  # rounded up to 8 registers per thread
    assert d["blocks_by_threads"] == 8
    assert d["blocks_by_smem"] == (228 * 1024) // (2048 + 1024)
    assert d["blocks_by_regs"] == 65536 // (48 * 256) == 5
    assert d["blocks_per_sm"] == 5


@functools.lru_cache(maxsize=None)
def _sampled(kernel: str, profile: str, dtype: str, layout: str) -> tuple:
    """40 feasible configs, drawn once per problem for the tests that share it (a draw of the matmul space
    costs seconds whatever its size: `Space.sample`)."""
    return tuple(spaces()[kernel].sample(problem(profile, dtype, layout), 40, seed=3))


def test_occupancy_figures_are_consistent(matmul, matvec):
    naive = matmul.derive(matmul.named("seed-naive"), problem("p100"))
    assert naive["smem_bytes"] == 0 and naive["blocks_by_smem"] == PROFILES["p100"].max_blocks_per_sm
    for space, kernel, where in ((matmul, "matmul", ("a100", "float32", "row")),
                                 (matvec, "matvec", ("l4", "float64", "col"))):
        prob = problem(*where)
        dev = prob.device
        for cfg in _sampled(kernel, *where):
            d = space.derive(cfg, prob)
            assert 1 <= d["blocks_per_sm"] <= dev.max_blocks_per_sm
            assert d["blocks_per_sm"] * d["threads"] <= dev.max_threads_per_sm
            assert d["blocks_per_sm"] * d["regs_per_block"] <= dev.regs_per_sm
            assert d["blocks_per_sm"] * (d["smem_bytes"] + dev.reserved_smem_per_block) <= dev.smem_per_sm
            assert d["blocks_per_sm"] == min(dev.max_blocks_per_sm, d["blocks_by_threads"], d["blocks_by_smem"],
                                             d["blocks_by_regs"])


def test_device_constraints_are_added_to_every_space():
    for space in spaces().values():
        device = [c.name for c in space.constraints if c.from_device]
        assert device == [name for name, _, _ in DEVICE_CONSTRAINTS]


# -- seeds and named configs -----------------------------------------------------------------------

@pytest.mark.parametrize("kernel,name,layout", SEEDS, ids=[s[1] for s in SEEDS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_seeds_are_feasible_on_every_profile(kernel, name, layout, dtype):
    space = spaces()[kernel]
    cfg = space.named(name)
    assert space.named_layouts.get(name, "row") == layout
    for profile in PROFILES:
        assert space.violations(cfg, problem(profile, dtype, layout)) == [], profile


def test_seed_shapes():
    mm, mv = spaces()["matmul"], spaces()["matvec"]
    assert mm.named("seed-naive")["smem"] == "none"
    for name, tile in (("seed-tiled16", 16), ("seed-tiled32", 32)):
        cfg = mm.named(name)
        assert (cfg["smem"], cfg["BM"], cfg["BN"], cfg["BK"], cfg["TM"], cfg["TN"]) == ("static", tile, tile, tile,
                                                                                        1, 1)
    cfg = mv.named("seed-matvec-colmajor")
    assert (cfg["smem"], cfg["ROWS"], cfg["THREADS_K"], cfg["STAGE_A"], cfg["X_SHARED"]) == ("dynamic", 16, 16,
                                                                                             True, True)


DEFAULT_CASES = [(k, lay, dt) for k, layouts in (("matmul", ("row",)), ("matvec", ("row", "col")))
                 for lay in layouts for dt in DTYPES]


@pytest.mark.parametrize("kernel,layout,dtype", DEFAULT_CASES)
def test_default_config_is_feasible_everywhere(kernel, layout, dtype):
    # The library's last fallback: for every dtype and device there must be a feasible default
    # (matvec's first defaults load 4 elements at once, too wide for float64: a second one takes over).
    space = spaces()[kernel]
    broken = {}
    for profile in PROFILES:
        prob = problem(profile, dtype, layout)
        cfg = space.default_config(layout, prob)
        assert cfg in space.named_configs.values()
        assert space.named_layouts.get(next(n for n, c in space.named_configs.items() if c == cfg), layout) == layout
        broken[profile] = space.violations(cfg, prob)
    assert broken == {p: [] for p in PROFILES}


def test_default_config_prefers_the_first_feasible_name(matvec):
    row32 = matvec.default_config("row", problem(dtype="float32", layout="row"))
    row64 = matvec.default_config("row", problem(dtype="float64", layout="row"))
    assert row32 == matvec.default_config("row")  # no problem: float32 on the default profile
    assert (row32["VEC"], row64["VEC"]) == (4, 2)
    assert matvec.default_config("col", problem(dtype="float64", layout="col"))["VEC"] * 8 <= 16
    with pytest.raises(UnknownNameError):
        spaces()["matmul"].default_config("col")


# -- config parsing --------------------------------------------------------------------------------

def test_config_rejects_unknown_params_and_values(matmul):
    base = dict(matmul.named("seed-tiled16"))
    with pytest.raises(UnknownNameError, match="'BQ'"):
        matmul.config({**base, "BQ": 16})
    with pytest.raises(InvalidValueError, match="BM=17"):
        matmul.config({**base, "BM": 17})
    with pytest.raises(InvalidValueError, match="smem"):
        matmul.config({**base, "smem": "shared"})
    with pytest.raises(InvalidValueError):
        matmul.config({**base, "A_TRANSPOSED": 1})  # an int is not a bool choice
    with pytest.raises(InvalidValueError):
        matmul.config({**base, "PAD": True})  # nor a bool an int choice
    missing = dict(base)
    del missing["BK"]
    with pytest.raises(InvalidValueError, match="BK"):
        matmul.config(missing)
    with pytest.raises(UnknownNameError, match="no-such"):
        matmul.config("no-such")
    with pytest.raises(UnknownNameError):
        matmul.with_overrides(matmul.named("seed-tiled16"), {"bm": "16"})  # names are case-sensitive


def test_with_overrides_coerces_command_line_text(matmul):
    base = matmul.named("seed-tiled16")
    cfg = matmul.with_overrides(base, {"BM": "128", "TM": " 8 ", "A_TRANSPOSED": "true", "smem": "static",
                                       "UNROLL": "4", "STAGES": "2"})
    assert cfg["BM"] == 128 and type(cfg["BM"]) is int
    assert cfg["TM"] == 8
    assert cfg["A_TRANSPOSED"] is True
    assert cfg["smem"] == "static"
    assert cfg["UNROLL"] == 4 and type(cfg["UNROLL"]) is int
    assert matmul.with_overrides(cfg, {"UNROLL": "FULL", "A_TRANSPOSED": "False"})["UNROLL"] == "full"
    assert matmul.with_overrides(cfg, {"smem": "Dynamic"})["smem"] == "dynamic"
    assert list(cfg) == list(matmul.params)  # declared order, whatever the override order
    assert base["BM"] == 16  # the base is untouched
    with pytest.raises(InvalidValueError, match="BM='100'"):
        matmul.with_overrides(base, {"BM": "100"})
    with pytest.raises(InvalidValueError):
        matmul.with_overrides(base, {"A_TRANSPOSED": "yes"})


@pytest.mark.parametrize("kernel,layout", [("matmul", "row"), ("matvec", "row"), ("matvec", "col")])
def test_config_key_round_trips_through_text(kernel, layout):
    space = spaces()[kernel]
    for cfg in _sampled(kernel, "a100", "float32", layout)[:30]:
        text = dict(item.split("=", 1) for item in cfg.key().split(","))
        again = space.with_overrides(space.default_config("row"), text)
        assert again == cfg and hash(again) == hash(cfg) and again.key() == cfg.key()
        assert [type(v) for v in again.values()] == [type(v) for v in cfg.values()]


def test_config_is_a_frozen_ordered_mapping(matmul):
    cfg = matmul.named("seed-tiled32")
    assert cfg.key().startswith("MATH=simt,smem=static,BM=32,BN=32,")
    assert cfg == dict(cfg) and len(cfg) == len(matmul.params)
    assert cfg != matmul.named("seed-tiled16")
    assert {cfg: 1}[Config(dict(cfg))] == 1
    with pytest.raises(TypeError):
        cfg["BM"] = 64  # type: ignore[index]


def test_problem_rejects_unknown_dtype_and_layout(matmul):
    with pytest.raises(InvalidValueError, match="int4"):
        matmul.is_feasible(matmul.named("seed-naive"), problem(dtype="int4"))
    with pytest.raises(InvalidValueError, match="diag"):
        matmul.derive(matmul.named("seed-naive"), problem(layout="diag"))


# -- optuna ----------------------------------------------------------------------------------------

def test_suggest_with_fixed_trial(matmul, matvec):
    optuna = pytest.importorskip("optuna")
    for space, name in ((matmul, "seed-tiled16"), (matvec, "seed-matvec-colmajor")):
        seed = space.named(name)
        cfg = space.suggest(optuna.trial.FixedTrial(dict(seed)))
        assert isinstance(cfg, Config)
        assert list(cfg) == list(space.params)
        assert cfg == seed


def test_suggest_in_a_real_study(matvec):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3), storage=None)
    seen: list[Config] = []
    prob = problem("h100", "float32", "col")

    def objective(trial):
        cfg = matvec.suggest(trial)
        seen.append(cfg)
        return 0.0 if matvec.is_feasible(cfg, prob) else 1.0

    study.optimize(objective, n_trials=12)
    assert len(seen) == 12 and len(study.trials) == 12
    for cfg, trial in zip(seen, study.trials, strict=True):
        assert isinstance(cfg, Config)
        assert list(cfg) == list(matvec.params)
        assert matvec.from_drawn(trial.params) == cfg  # the draws, plus inactive values
        assert all(cfg[p.name] in p.choices for p in matvec.params.values())
    assert len(set(seen)) > 1  # the sampler really varies the point


@pytest.mark.parametrize("kernel", ["matmul", "matvec"])
def test_conditional_parameters_are_well_formed(kernel):
    """An inactive value outside the choices would silently make every config where the parameter is
    inactive infeasible."""
    space = load_space(kernel)
    for p in space.params.values():
        if p.active is not None:
            assert p.inactive in p.choices, p.name


def test_conditional_parameters_are_not_drawn_where_inactive(matmul):
    """suggest() draws WM/WN only for tf32x3/dmma, TM/TN only for simt, PRODUCERS only for wgmma; the others
    take their inactive value."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        cfg = matmul.suggest(trial)
        drawn = set(trial.params)
        if cfg["MATH"] == "simt":
            assert {"TM", "TN"} <= drawn and not {"WM", "WN"} & drawn and (cfg["WM"], cfg["WN"]) == (32, 32)
        elif cfg["MATH"] == "skinny":
            assert {"TN", "THREADS_K", "STEPS", "VEC"} <= drawn
            assert not {"WM", "WN", "TM", "PAD", "A_TRANSPOSED", "BK", "STAGES", "PRODUCERS"} & drawn
        elif cfg["MATH"] in ("wgmma", "wgmma_direct"):
            assert not {"WM", "WN", "TM", "TN", "PAD", "A_TRANSPOSED"} & drawn
            assert ("PRODUCERS" in drawn) == (cfg["MATH"] == "wgmma")
            assert ({"CLUSTER_M", "STORE", "PINGPONG"} <= drawn) == (cfg["MATH"] == "wgmma_direct")
            assert "PERSISTENT" in drawn  # wgmma's too (LOADER=registers)
            assert (cfg["WM"], cfg["WN"], cfg["TM"], cfg["TN"]) == (32, 32, 1, 1)
        else:
            assert {"WM", "WN"} <= drawn and not {"TM", "TN", "PAD", "A_TRANSPOSED"} & drawn
            assert (cfg["TM"], cfg["TN"], cfg["PAD"], cfg["A_TRANSPOSED"]) == (1, 1, 0, False)
        if cfg["MATH"] != "wgmma":
            assert "PRODUCERS" not in drawn and cfg["PRODUCERS"] == 1
        if cfg["MATH"] != "skinny":
            assert not {"THREADS_K", "STEPS"} & drawn and (cfg["THREADS_K"], cfg["STEPS"]) == (1, 1)
        seen.add(cfg["MATH"])
        study.tell(trial, 1.0)
    assert seen == {"simt", "tf32x3", "dmma", "wgmma", "wgmma_direct", "skinny", "mma"}
    # Where the sampler could not pick it, a config may not set it either.
    wrong = matmul.with_overrides(matmul.named("tf32x3-128"), {"TM": 8})
    assert any(line.startswith("breaks 'TM only where") for line in matmul.violations(wrong, problem()))


def test_mma_needs_a_16_bit_type_or_int8_sm80_whole_mmas_and_no_rounding_atomic_splits(matmul):
    config = matmul.named("mma-128")
    for dtype in ("bfloat16", "float16", "int8"):
        assert matmul.is_feasible(config, problem("a100", dtype)) and matmul.is_feasible(config, problem("l4", dtype))
        assert matmul.is_feasible(config, problem("h100", dtype))
    for prob in (problem("v100", "float16"), problem("a100", "float32"), problem("a100", "float64")):
        assert any("mma on bfloat16, float16 and int8" in line for line in matmul.violations(config, prob))
    assert not matmul.is_feasible(matmul.with_overrides(config, {"BK": 16}), problem("a100", "int8"))  # k32
    for overrides in ({"BK": 8}, {"SPLIT_K": 2, "SPLIT_REDUCE": "atomic"}):
        wrong = matmul.with_overrides(config, overrides)
        violations = matmul.violations(wrong, problem("a100", "bfloat16"))
        assert any("mma on bfloat16, float16 and int8" in line for line in violations)
    assert matmul.is_feasible(matmul.named("mma-64-split4"), problem("a100", "bfloat16"))


def test_tf32x3_needs_float32_and_sm80(matmul):
    config = matmul.named("tf32x3-128")
    assert matmul.is_feasible(config, problem("a100")) and matmul.is_feasible(config, problem("h100"))
    for prob in (problem("v100"), problem("p100"), problem("h100", "float64")):
        assert any("tf32x3 on float32 and sm_80" in line for line in matmul.violations(config, prob))


# -- bounded evaluation ----------------------------------------------------------------------------

def _tiny(derived: dict | None = None, constraints: list | None = None, params: dict | None = None) -> dict:
    """A minimal space: three parameters and the derived quantities every space needs (plus `derived`)."""
    return {"kernel": "tiny", "template": "tiny.cu.j2",
            "params": {"smem": ["none", "static"], "A": [1, 2, 4], "B": [1, 2], **(params or {})},
            "derived": {"threads": "32 * A", "smem_bytes": "0", "regs_per_thread": "32", **(derived or {})},
            "constraints": constraints or []}


def test_derived_text_cannot_double_from_one_quantity_to_the_next():
    # Each `+` only doubles its operand, but a chain of derived quantities doubles it again and again.
    chain = {"d0": "smem + smem", **{f"d{i}": f"d{i - 1} + d{i - 1}" for i in range(1, 8)}}
    space = Space(_tiny(chain), "tiny.yaml")
    with pytest.raises(SpaceDefinitionError) as info:
        space.count(problem())
    assert str(info.value).startswith("tiny.yaml: derived d7: 'd6 + d6': a str of length 1536 passes the limit")
    config = space.config({"smem": "static", "A": 1, "B": 1})
    with pytest.raises(SpaceDefinitionError, match="d7"):
        space.derive(config, problem())
    assert len(space.derive(space.with_overrides(config, {"smem": "none"}), problem())["d7"]) == 1024


def test_enumeration_keeps_the_guards_for_a_device_outside_the_assumed_bounds():
    space = Space(_tiny({"x": "sm_count * 4"}, [{"name": "some", "expr": "x > 0"}]), "tiny.yaml")
    assert space.count(problem()).feasible == 12
    huge = Problem(dataclasses.replace(PROFILES["h100"], sm_count=2**63))
    with pytest.raises(SpaceDefinitionError, match=r"tiny.yaml: derived x: 'sm_count \* 4': .*2\*\*64"):
        space.count(huge)


@pytest.mark.parametrize("kernel", ["matmul", "matvec"])
def test_shipped_spaces_enumerate_without_guards(kernel):
    """The bounds of the shipped parameters prove every `*` and `%` of their spaces safe, so enumeration
    runs plain arithmetic (the guards would cost a function call each, millions of times)."""
    space = load_space(kernel)
    for derived, constraints in space._plan:
        for expr in [e for _, e in derived] + [c.expr for c in constraints]:
            assert not [n for n in expr._code.co_names if n.startswith("<")], expr.text


def test_suggest_evaluates_conditions_that_call_functions():
    """An `active` condition may call the allowed functions (max here) in suggest() and from_drawn() too."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = Space(_tiny(params={"C": {"choices": [8, 16], "active": "max(A, B) >= 4", "inactive": 8}}), "tiny.yaml")
    study = optuna.create_study()
    study.enqueue_trial({"smem": "none", "A": 4, "B": 1, "C": 16})
    study.enqueue_trial({"smem": "none", "A": 2, "B": 2, "C": 16})
    drawn = []
    for _ in range(2):
        trial = study.ask()
        config = space.suggest(trial)
        drawn.append((dict(config), set(trial.params)))
        assert space.from_drawn(trial.params) == config
        study.tell(trial, 0.0)
    assert drawn[0] == ({"smem": "none", "A": 4, "B": 1, "C": 16}, {"smem", "A", "B", "C"})
    assert drawn[1] == ({"smem": "none", "A": 2, "B": 2, "C": 8}, {"smem", "A", "B"})  # C not drawn


# -- malformed space files -------------------------------------------------------------------------

def _edit(**changes):
    """A change to the tiny space's data: a key set to a value (None: removed), or params.X / derived.X."""
    def apply(data: dict) -> dict:
        for key, value in changes.items():
            section, _, name = key.partition("__")
            target = data[section] if name else data
            name = name or section
            if value is _DROP:
                del target[name]
            else:
                target[name] = value
        return data
    return apply


_DROP = object()

# (file content: bytes, text, or an edit of the tiny space) -> a piece of the one-line message
MALFORMED = {
    "empty file": ("", "the space is empty"),
    "only a comment": ("# nothing yet\n", "the space is empty"),
    "list at top level": ("- kernel\n- params\n", "the space is a list, not a mapping"),
    "text at top level": ("matmul\n", "the space is the text 'matmul', not a mapping"),
    "binary": (b"kernel: \xff\xfe\x00\x81 \x89PNG\n", "not UTF-8 text (byte 0xff at offset 8)"),
    "bad YAML": ("kernel: [unclosed\n", "not valid YAML: expected ',' or ']'"),
    "no kernel": (_edit(kernel=_DROP), "missing field 'kernel'"),
    "template a list": (_edit(template=["a.cu.j2"]), "'template' must be a non-empty text, not a list"),
    "layouts a text": (_edit(layouts="row"), "'layouts' must be a list of layouts such as [row, col], not the text"),
    "params a list": (_edit(params=["smem", "A"]), "'params' must be a mapping of parameter names to their choices, "
                                                   "not a list"),
    "params a text": (_edit(params="smem"), "'params' must be a mapping"),
    "param without choices": (_edit(params__A={"doc": "rows"}), "parameter 'A' has no choices"),
    "param with empty choices": (_edit(params__A={"choices": []}), "parameter 'A' has no choices"),
    "param null": (_edit(params__A=None), "parameter 'A' must be a list of choices or a mapping with 'choices', "
                                          "not null"),
    "param a number": (_edit(params__A=64), "parameter 'A' must be a list of choices or a mapping with 'choices', "
                                            "not the number 64"),
    "choices a text": (_edit(params__A={"choices": "64"}), "'choices' of parameter 'A' must be a list, not the "
                                                          "text '64'"),
    "choices a mapping": (_edit(params__A={"choices": {"a": 1}}), "'choices' of parameter 'A' must be a list, "
                                                                  "not a mapping"),
    "choice a list": (_edit(params__A=[[1, 2], 4]), "a value of parameter 'A' must be text, a number or a boolean, "
                                                    "not a list"),
    "param name a number": (lambda data: dict(data, params={**data["params"], 3: [1, 2]}),
                            "the parameter name 3 is not an identifier"),
    "param name not an identifier": (_edit(**{"params__A-B": [1]}), "the parameter name 'A-B' is not an identifier"),
    "param name of a function": (_edit(params__max=[1, 2]), "the parameter name 'max' is taken"),
    "param name of a device quantity": (_edit(params__cc=[80]), "the parameter name 'cc' is taken"),
    "active not text": (_edit(params__C={"choices": [1, 2], "active": 5, "inactive": 1}),
                        "active of C must be an expression in quotes, not the number 5"),
    "derived a list": (_edit(derived=["threads"]), "'derived' must be a mapping of names to expressions, not a list"),
    "derived a text": (_edit(derived="threads = 32"), "'derived' must be a mapping of names to expressions, "
                                                      "not the text"),
    "derived a number": (_edit(derived__threads=256), "derived threads must be an expression in quotes, "
                                                      "not the number 256"),
    "derived null": (_edit(derived__threads=None), "derived threads must be an expression in quotes, not null"),
    "derived name of a parameter": (_edit(derived__A="2"), "the derived quantity name 'A' is taken"),
    "derived name of the device model": (_edit(derived__blocks_per_sm="2"),
                                         "the derived quantity name 'blocks_per_sm' is taken"),
    "constraints a mapping": (_edit(constraints={"a": "A > 1"}), "'constraints' must be a list of mappings with "
                                                                 "'name' and 'expr', not a mapping"),
    "constraint without expr": (_edit(constraints=[{"name": "big"}]), "constraint 1 of 'constraints' has no 'expr' "
                                                                      "(keys: name)"),
    "constraint without expr, a key of two lines": (_edit(constraints=[{"na\nme": "big"}]),
                                                    "has no 'expr' (keys: 'na\\nme')"),
    "constraint a text": (_edit(constraints=[{"expr": "A > 0"}, "A > 1"]),
                          "constraint 2 of 'constraints' is the text 'A > 1', not a mapping with 'name' and 'expr'"),
    "constraint expr a boolean": (_edit(constraints=[{"name": "on", "expr": True}]),
                                  "constraint on must be an expression in quotes, not the boolean true"),
    "constraint expr a list": (_edit(constraints=[{"name": "on", "expr": ["A > 1"]}]),
                               "constraint on must be an expression in quotes, not a list"),
    "configs a list": (_edit(configs=["c"]), "'configs' must be a mapping of names to parameter values, not a list"),
    "config a list": (_edit(configs={"c": [1, 2]}), "config 'c' must be a mapping of parameters to values, not a list"),
    "config value not a choice": (_edit(configs={"c": {"smem": "none", "A": 3, "B": 1}}),
                                  "config 'c': A=3 is not among the choices [1, 2, 4]"),
    "config unknown param": (_edit(configs={"c": {"smem": "none", "A": 1, "B": 1, "Z": 1}}),
                             "config 'c': tiny: unknown parameter 'Z'"),
    "default a number": (_edit(default=5), "'default' must be a mapping of layouts to config names, not the number 5"),
    "default of a layout a number": (_edit(default={"row": 5}), "'default' for layout row must be a config name or "
                                                                "a list of them, not the number 5"),
}


@pytest.mark.parametrize("content,needle", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_space_file_is_one_line_naming_file_and_key(tmp_path, content, needle):
    path = tmp_path / "tiny.yaml"
    if callable(content):
        path.write_text(yaml.safe_dump(content(_tiny()), sort_keys=False))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(SpaceDefinitionError) as info:
        Space.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and needle in message and "\n" not in message, message


def test_tiny_space_loads_through_a_file(tmp_path):
    # The control for the cases above.
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(_tiny(), sort_keys=False))
    space = Space.load(path)
    assert list(space.params) == ["smem", "A", "B"] and space.count(problem()).feasible == 12


def test_an_expression_that_fails_on_the_space_values_is_a_definition_error():
    """A choice of the wrong kind or a division by zero surfaces when the space is evaluated: the error names
    the file, the expression and the values, whichever method met it."""
    data = _tiny({"per_a": "64 // (A - 1)"}, [{"name": "positive", "expr": "B > 0"}])
    data["params"]["B"] = [1, 2, "x"]
    space = Space(data, "tiny.yaml")
    with pytest.raises(SpaceDefinitionError) as info:
        space.count(problem())
    assert str(info.value) == ("tiny.yaml: derived per_a: '64 // (A - 1)' fails with A=1: "
                               "ZeroDivisionError: integer division or modulo by zero")
    with pytest.raises(SpaceDefinitionError, match="tiny.yaml: derived per_a: .* with A=1: ZeroDivisionError"):
        space.violations(space.config({"smem": "none", "A": 1, "B": 1}), problem())
    with pytest.raises(SpaceDefinitionError) as info:  # the samplers' check (`feasibility`)
        space.is_feasible(space.config({"smem": "none", "A": 1, "B": 1}), problem())
    assert str(info.value) == ("tiny.yaml: derived per_a: '64 // (A - 1)' fails with A=1: "
                               "ZeroDivisionError: integer division or modulo by zero")
    data["derived"]["per_a"] = "64 // A"
    space = Space(data, "tiny.yaml")
    with pytest.raises(SpaceDefinitionError) as info:
        space.feasible(problem())
    assert str(info.value) == ("tiny.yaml: constraint positive: 'B > 0' fails with B='x': "
                               "TypeError: '>' not supported between instances of 'str' and 'int'")
    with pytest.raises(SpaceDefinitionError, match="'B > 0' fails with B='x': TypeError"):
        space.check(space.config({"smem": "none", "A": 1, "B": "x"}), problem())
    with pytest.raises(SpaceDefinitionError, match="constraint positive: 'B > 0' fails with B='x': TypeError"):
        space.is_feasible(space.config({"smem": "none", "A": 1, "B": "x"}), problem())


def test_a_space_narrowed_away_from_an_inactive_value_keeps_the_parameter_active(matmul):
    """`--fix LOADER=presplit`: LOADER's inactive value (registers, outside MATH=wgmma) is narrowed away, so
    every feasible config runs MATH=wgmma with LOADER=presplit. Before, a drawn SIMT config held LOADER=registers,
    passed as feasible, ran, and then failed the tune's re-timing of its finalists (`config()` refused the
    value): the whole run's result was lost (H100, 2026-12-06)."""
    narrowed = matmul.restricted({"LOADER": "presplit"})
    prob = problem("h100", "float32", "nn")
    simt = dict(matmul.named_configs["seed-tiled32"])
    assert simt["MATH"] != "wgmma" and simt["LOADER"] == "registers"
    assert not narrowed.is_feasible(Config(simt), prob)
    assert any("narrowed to its active values" in v for v in narrowed.violations(Config(simt), prob))
    feasible = narrowed.feasible(prob, limit=40)
    assert feasible
    for config in feasible:
        assert config["MATH"] == "wgmma" and config["LOADER"] == "presplit"
        assert narrowed.config(dict(config)) == config  # what the finalists' re-timing does
    # the unnarrowed space is as before: LOADER inactive outside wgmma
    assert matmul.is_feasible(Config(simt), problem("h100", "float32", "row"))
