"""Every command in the README is run: here, by a named test, or by the Makefile target it is.

``readme_commands`` collects every command the README shows (the lines of its shell code blocks,
and each inline `` `warmfleet ...` ``, `` `make ...` ``, `` `kubectl ...` ``, `` `helm ...` `` or
`` `.venv/bin/...` ``; a bare `` `ls` `` beside `` `warmfleet cache prefetch URI` `` in a table
cell is `` warmfleet cache ls ``). ``RUNS`` says, for each, how it is run, and the tests below
check that: a command run here has its test in this module; a command run elsewhere names a test
that exists, in a file that spells the command's subcommands and flags (so the test really runs
that command); a ``make`` target exists and its recipe is what the README says it is. A command
the README gains without an entry here, or an entry the README lost, fails.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from docs_support import README, ROOT, code_blocks, code_spans, section

from warmfleet.sim.scenario import BUILTIN_WORKLOADS

WARMFLEET = str(Path(sys.executable).parent / "warmfleet")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SHELL = ("", "bash", "sh", "shell", "console")
_PREFIXES = ("warmfleet ", "make ", ".venv/bin/", "kubectl ", "helm ")
_WORD = re.compile(r"^[a-z][a-z-]*$")


def readme_commands(text: str) -> list[str]:
    found: list[str] = []
    for match in _FENCE.finditer(text):
        if match.group(1) in _SHELL:
            for line in match.group(2).replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line:
                    found.append(" ".join(line.split()))
    for line in _FENCE.sub("", text).splitlines():
        in_table = line.startswith("|")
        for cell in line.strip().strip("|").split("|") if in_table else [line]:
            parent: list[str] = []
            for span in code_spans(cell):
                words = span.split()
                if span.startswith(_PREFIXES):
                    found.append(" ".join(words))
                    is_group = words[0] == "warmfleet" and len(words) > 1 and _WORD.match(words[1])
                    parent = words[:2] if is_group else []
                elif parent and in_table and _WORD.match(words[0]):
                    found.append(" ".join([*parent, *words]))
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Here:
    """Run by ``test`` in this module, as written."""

    test: str


@dataclass(frozen=True)
class ByTest:
    """Run by ``test`` (``path::name``); ``files`` (the test's file first, then helpers it runs
    the command through) spell every subcommand and flag of the command, or ``spells``."""

    test: str
    files: tuple[str, ...] = ()
    spells: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """A ``make`` target whose recipe runs ``runs`` (``make test`` and the e2e targets run the
    tests; the bench targets are the measurement runs whose figures the README quotes)."""

    runs: str


_SIM_RESULTS = (
    "warmfleet sim --scenario aws-long-context --instances 7 --preset llama-3.1-70b-p5 --seed 0 "
    "--strategies random,prefix_hash,prefix_affinity,sglang_cache_aware,llmd_approx --json out.json"
)
_SIM_TABLE = (
    "warmfleet sim --scenario mooncake --strategies random,prefix_affinity --requests 1000 "
    "--json out.json --report dir/"
)
_CLI_FAILURES = "tests/cli/test_cli_failures.py"
_GATEWAY_CLI = "tests/gateway/test_gateway_cli.py"
_AGENT_CLI = "tests/agent/test_agent_cli.py::test_cli_prefetch_ls_pin_gc_verify"
_OPERATOR_CLI = "tests/operator/test_operator_cli.py"
_K8S_API = "tests/k8s/test_k8s_api.py"

RUNS: dict[str, Here | ByTest | Target] = {
    "make demo": Target("$(BIN)/warmfleet demo"),
    "make test": Target("lint typecheck imports vllm-model unit k8s-e2e e2e-vllm"),
    "make k8s-e2e": Target("tests/k8s"),
    "make e2e-vllm": Target("tests/e2e/test_e2e_vllm.py"),
    "make help": Here("test_make_help_runs"),
    "make bench-routing": Target("warmfleet.bench.routing_bench"),
    "make bench-peers": Target("warmfleet.bench.peers"),
    "make bench-replicas": Target("--gateway-replicas 1,2,4,8,16"),
    "make bench-cache": Target("harness.cache_bench"),
    "make bench-fleet": Target("harness.fleet_acceptance"),
    "make bench-flow": Target("warmfleet.bench.flow_bench"),
    '.venv/bin/pytest -m "not slow"': Target("pytest"),  # `make unit` without the slow tests
    "kubectl apply -f deploy/crds/": ByTest(
        f"{_K8S_API}::test_crds_established",
        ("tests/k8s/conftest.py",),
        ('"apply", "-f", str(DEPLOY / "crds")',),
    ),
    "helm install warmfleet deploy/helm/warmfleet -n warmfleet-system --create-namespace": ByTest(
        f"{_K8S_API}::test_helm_chart_applied",
        (_K8S_API,),
        ('helm.Chart.load(str(DEPLOY / "helm" / "warmfleet"))', 'namespace="warmfleet-system"'),
    ),
    "kubectl apply -f deploy/examples/vllm-llama-3.1-70b.yaml": ByTest(
        f"{_K8S_API}::test_valid_examples_accepted",
        (_K8S_API,),
        ('DEPLOY.glob("examples/*.yaml")', '"apply", "--dry-run=server"'),
    ),
    _SIM_RESULTS: Here("test_readme_results_command_reproduces_its_table"),
    _SIM_TABLE: Here("test_readme_sim_command_runs_without_traces"),
    "warmfleet sim": Here("test_readme_sim_command_runs_without_traces"),
    "warmfleet sim --json": Here("test_readme_sim_command_runs_without_traces"),
    "warmfleet doctor TRACE --instances 8 --json out.json --report dir/": ByTest(
        "tests/sim/test_sim_doctor.py::test_doctor_on_a_capture"
    ),
    "warmfleet sim --trace FILE": ByTest(
        "tests/sim/test_sim_trace_file.py::test_trace_with_header_runs_on_its_fleet_and_reports_tenants"
    ),
    "warmfleet --version": Here("test_version_runs"),
    "warmfleet serve --config gateway.yaml --check": Here("test_three_steps_gateway_checks"),
    "warmfleet serve --config gateway.yaml": ByTest(
        f"{_GATEWAY_CLI}::test_serve_sighup_reload_and_sigterm",
        (_GATEWAY_CLI, "tests/gateway/gateway_process_support.py"),
    ),
    "warmfleet serve": ByTest(f"{_CLI_FAILURES}::test_serve_on_a_busy_port_is_one_line"),
    "warmfleet emulate --instances 8 --preset tiny-cpu": ByTest(
        "tests/emulator/test_emulator_config_cli.py::"
        "test_warmfleet_emulate_prints_urls_and_stops_on_sigterm"
    ),
    "warmfleet emulate": ByTest(f"{_CLI_FAILURES}::test_emulate_on_a_busy_port_is_one_line"),
    "warmfleet bench --url http://127.0.0.1:8080 --scenario gsp ...": ByTest(
        f"{_CLI_FAILURES}::"
        "test_bench_through_the_gateway_picks_the_model_and_fails_loudly_on_a_wrong_one"
    ),
    "warmfleet conformance --engine URL --gateway-tokenizer DIR": ByTest(
        "tests/e2e/test_e2e_conformance_cli.py::test_conformance_command_agrees_with_the_engine"
    ),
    "warmfleet cache prefetch URI": ByTest(_AGENT_CLI),
    "warmfleet cache ls": ByTest(_AGENT_CLI),
    "warmfleet cache verify [--full]": ByTest(_AGENT_CLI),
    "warmfleet cache pin": ByTest(_AGENT_CLI),
    "warmfleet cache unpin": ByTest(_AGENT_CLI),
    "warmfleet cache gc": ByTest(_AGENT_CLI),
    "warmfleet cache agent --config node.yaml": ByTest(
        f"{_CLI_FAILURES}::test_cache_agent_failures_are_one_line"
    ),
    "warmfleet up": ByTest("tests/operator/test_embedded_up.py::test_ctrl_c_stops_every_child"),
    "warmfleet up examples/fleet.yaml": ByTest(
        f"{_CLI_FAILURES}::test_up_on_a_busy_gateway_port_is_one_line_and_stops_its_children"
    ),
    "warmfleet status": ByTest(f"{_CLI_FAILURES}::test_status_says_a_stopped_fleet_is_not_running"),
    "warmfleet fleet render": ByTest(f"{_OPERATOR_CLI}::test_render_and_bad_whatif_params"),
    "warmfleet fleet whatif": ByTest(f"{_OPERATOR_CLI}::test_whatif_merges_into_existing_report"),
    "warmfleet fleet operator": ByTest(
        "tests/operator/test_kubeconfig.py::test_operator_outside_a_cluster_is_one_line_and_exit_2"
    ),
}

README_TEXT = README.read_text(encoding="utf-8")


def test_every_readme_command_says_how_it_is_run() -> None:
    commands = readme_commands(README_TEXT)
    assert len(README_TEXT.splitlines()) <= 350
    assert sorted(set(commands) - set(RUNS)) == [], "README commands nobody runs"
    assert sorted(set(RUNS) - set(commands)) == [], "entries for commands the README lost"


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _spelled(command: str) -> list[str]:
    """What a test must spell to run ``command``: its subcommands and flags."""
    words = command.replace("[", " ").replace("]", " ").split()[1:]
    return [w for w in words if w.startswith("--") or _WORD.match(w)]


@pytest.mark.parametrize("command", [c for c, r in RUNS.items() if isinstance(r, ByTest)])
def test_commands_run_by_other_tests(command: str) -> None:
    run = RUNS[command]
    assert isinstance(run, ByTest)
    path, _, name = run.test.partition("::")
    assert (ROOT / path).is_file(), run.test
    if name:
        assert name in _functions(ROOT / path), run.test
    text = "\n".join((ROOT / f).read_text(encoding="utf-8") for f in (path, *run.files))
    spells = run.spells or tuple(f'"{w}"' for w in _spelled(command))
    missing = [s for s in spells if s not in text]
    assert not missing, f"{run.test} does not spell {missing} of {command!r}"


@pytest.mark.parametrize("command", [c for c, r in RUNS.items() if isinstance(r, Here)])
def test_commands_run_here_have_their_test(command: str) -> None:
    run = RUNS[command]
    assert isinstance(run, Here)
    assert run.test in _functions(Path(__file__)), run.test


def _recipe(target: str) -> str:
    """The prerequisites and recipe lines of ``target`` in the Makefile."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    body = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line)
    return "\n".join(body)


@pytest.mark.parametrize("command", [c for c, r in RUNS.items() if isinstance(r, Target)])
def test_make_targets_run_what_the_readme_says(command: str) -> None:
    run = RUNS[command]
    assert isinstance(run, Target)
    if command.startswith(".venv/bin/pytest"):
        assert "slow: takes more than about 2 s" in (ROOT / "pyproject.toml").read_text("utf-8")
        assert ".venv/bin/pytest" in _recipe("unit").replace("$(BIN)", ".venv/bin")
        return
    assert run.runs in _recipe(command.split()[1])


def _run(*args: str, cwd: Path, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WARMFLEET_TRACES_DIR"}
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout_s, check=False, cwd=cwd,
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_version_runs(tmp_path: Path) -> None:
    done = _run(WARMFLEET, "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("warmfleet ")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_runs() -> None:
    done = _run("make", "-s", "--no-print-directory", "help", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "make demo" in done.stdout


def test_three_steps_gateway_checks(tmp_path: Path) -> None:
    """Steps 1 and 2 of "In front of your vLLM": the README's `gateway.yaml`, checked."""
    steps = section(README_TEXT, "## In front of your vLLM in three steps")
    (_, gateway_yaml), *_ = code_blocks(steps + "\n", "yaml")
    (tmp_path / "gateway.yaml").write_text(gateway_yaml, encoding="utf-8")
    done = _run(WARMFLEET, *"serve --config gateway.yaml --check".split(), cwd=tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


@pytest.mark.slow
def test_readme_sim_command_runs_without_traces(tmp_path: Path) -> None:
    """The "Using it" sim command, from a directory with no ../shared beside it: the trace
    scenario runs its synthetic equivalent and writes the JSON report and the plots."""
    assert "mooncake" in BUILTIN_WORKLOADS
    done = _run(WARMFLEET, *_SIM_TABLE.split()[1:], cwd=tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert done.stdout.startswith("workload: synthetic equivalent of ")
    report = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert report["requests"] == 1000
    assert set(report["strategies"]) == {"random", "prefix_affinity"}
    assert (tmp_path / "dir" / "report.json").is_file()
    assert (tmp_path / "dir" / "ttft_cdf.png").is_file()


def _results_table() -> dict[str, list[str]]:
    """README results table: strategy -> its TTFT p50/p90/p99, hit rate and share min-max
    cells (emphasis and spill counts dropped)."""
    block = section(README_TEXT, "### Simulator: AWS's claims, re-run (`warmfleet sim`)")
    rows: dict[str, list[str]] = {}
    for line in block.splitlines():
        cells = [c.replace("*", "").strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[1][:1].isdigit():
            rows[cells[0].split()[0]] = [cells[1], cells[2].split(" (")[0], cells[3]]
    return rows


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_results_command_reproduces_its_table(tmp_path: Path) -> None:
    """The simulator results command, as written: deterministic, so its TTFT percentiles, hit
    rates and shares are the README's (90 s on 2 idle cores, 4.5 min on busy ones)."""
    table = _results_table()
    strategies = _SIM_RESULTS.split("--strategies ")[1].split(maxsplit=1)[0]
    assert set(table) == set(strategies.split(","))
    done = _run(WARMFLEET, *_SIM_RESULTS.split()[1:], cwd=tmp_path, timeout_s=850.0)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    for name, cells in table.items():
        metrics = report["strategies"][name]
        ttft = " / ".join(f"{metrics['ttft_ms'][p]:,.0f}" for p in ("p50", "p90", "p99"))
        share = f"{metrics['share']['min']:.1f}\N{EN DASH}{metrics['share']['max']:.1f} %"
        assert [ttft, f"{metrics['hit_rate'] * 100:.1f} %", share] == cells, name
