"""The example workflow (``docs/examples/miles-gate.yml``) run as written: its install names
what the Miles trees import, its Verdict step turns each exit code of the gate into the
check's result, and its install and gate steps run on a temporary git checkout of the
tree pytest was given with one commit that changes a line.

The steps' ``run:`` lines are executed with bash as GitHub runs them (``bash --noprofile
--norc -eo pipefail``), in a workspace laid out as the workflow's checkouts are (``miles``,
``harness``, ``.venv``), with three stand-ins: the repository's own virtual environment is
``.venv`` (the line that creates a venv is left out), pip installs with ``--dry-run
--no-index`` (the requirements resolve against what is installed, nothing is downloaded
or changed), and the gate runs one matrix case (``--scenario sync``) instead of the
default set, to keep the test short; the exit code handling is the same."""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.upstream import source

yaml = pytest.importorskip("yaml", reason="needs PyYAML to read the workflow: pip install pyyaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "examples" / "miles-gate.yml"
GITHUB_BASH = ["bash", "--noprofile", "--norc", "-eo", "pipefail"]
GIT_ID = ["-c", "user.name=gate-test", "-c", "user.email=gate-test@localhost", "-c", "commit.gpgsign=false"]


def step(name: str) -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    found = {s.get("id", s["name"]): s for s in doc["jobs"]["gate"]["steps"]}
    return found[name]


def install_step() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return next(s for s in doc["jobs"]["gate"]["steps"] if s["name"].startswith("Install the harness"))


def verdict(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GITHUB_BASH, "-c", step("Verdict")["run"]],
        env={"PATH": "/usr/bin:/bin", "GATE_EXIT": code},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_verdict_step_fails_the_check_on_a_finding_or_unchecked_code_and_warns_on_the_rest():
    results = {code: verdict(code) for code in ("0", "1", "2", "3", "4", "")}
    assert {c: r.returncode for c, r in results.items()} == {"0": 0, "1": 1, "2": 0, "3": 0, "4": 1, "": 1}
    assert results["1"].stdout.startswith("::error::a new invariant violation")
    assert results["4"].stdout.startswith(
        "::error::changed async code never ran in any case, or a case started on neither"
    )
    assert results["2"].stdout.startswith("::warning::") and results["3"].stdout.startswith("::warning::")
    assert "the gate did not finish (exit )" in results[""].stdout  # the gate step did not get to write its exit


# --------------------------------------------------------------------------- the install


def _requirements_closure(seeds: list[str]) -> set[str]:
    """The distributions ``seeds`` (requirement strings) install, following the installed
    distributions' own requirements (their markers evaluated here, extras followed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in seeds]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            needs = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for text in needs:
            sub = Requirement(text)
            extras = [{"extra": e} for e in (req.extras or {""})]
            if sub.marker is None or any(sub.marker.evaluate(e) for e in extras):
                todo.append(sub)
    return {name for name, _ in seen}


def _installed_by_the_workflow() -> set[str]:
    """What the install step's pip lines install: the harness with the extras it names,
    and the packages it names itself."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    seeds: list[str] = []
    for line in install_step()["run"].splitlines():
        if " pip install " not in line or "--upgrade pip" in line:
            continue
        harness = re.search(r"\./harness\[([\w,]+)\]", line)
        if harness:
            seeds += project["dependencies"]
            for extra in harness.group(1).split(","):
                seeds += project["optional-dependencies"][extra]
        else:
            seeds += [w for w in line.split(" pip install ", 1)[1].split() if not w.startswith("-") and "://" not in w]
    return _requirements_closure(seeds)


_IMPORT = re.compile(r"^(?:from\s+([\w.]+)\s+import\b|import\s+([\w., ]+))", re.M)


def _imports(tree: Path) -> set[str]:
    """The top-level packages ``tree``'s files import unconditionally (an import statement
    at the start of a line: module level, not under ``try:`` or in a function), outside
    the standard library and Miles itself."""
    out: set[str] = set()
    for path in [*(tree / "miles").rglob("*.py"), *(tree / d for d in source.DRIVER_FILES)]:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for found in _IMPORT.finditer(text):
            names = [found.group(1)] if found.group(1) else found.group(2).split(",")
            out |= {n.strip().split(" ")[0].split(".")[0] for n in names if n.strip()}
    return out - set(sys.stdlib_module_names) - {"miles", ""}


def test_the_install_names_every_installed_package_the_miles_trees_import():
    from packaging.utils import canonicalize_name

    trees = sorted(p for p in source.DEFAULT_TREE.parent.glob("miles-*") if (p / "miles").is_dir())
    if not trees:
        pytest.skip(f"no Miles tree beside the repository ({source.DEFAULT_TREE.parent}) to read the imports of")
    installed = _installed_by_the_workflow()
    dists = md.packages_distributions()
    missing: dict[str, list[str]] = {}
    for tree in trees:
        for module in _imports(tree):
            # a package not installed here (megatron, parts of sglang) is one the harness
            # stands in for (harness/upstream/leaf_fakes.py), or a refusal the gate names
            names = {canonicalize_name(d) for d in dists.get(module, [])}
            if names and not names & installed:
                missing.setdefault(f"{module} ({', '.join(sorted(names))})", []).append(tree.name)
    assert not missing, f"the workflow's install does not install what these trees import: {missing}"


# --------------------------------------------------------------------------- install and gate, run


def _workspace(tmp: Path, tree: Path) -> tuple[Path, str]:
    """The runner's workspace: ``miles`` a git checkout of ``tree`` with a second commit
    changing one line that every case runs, ``harness`` this repository, ``.venv`` the
    repository's virtual environment behind the stand-ins; returns it and the base commit."""
    miles = tmp / "miles"
    shutil.copytree(tree / "miles", miles / "miles", ignore=shutil.ignore_patterns("__pycache__"))
    for name in source.DRIVER_FILES:
        shutil.copy(tree / name, miles / name)
    git = ["git", "-C", str(miles)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, *GIT_ID, "commit", "-q", "-m", "base"], check=True)
    base = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    path = miles / "miles" / "rollout" / "data_source.py"
    header = "    def get_samples(self, num_samples):\n"
    text = path.read_text()
    if header not in text:
        pytest.skip(f"miles/rollout/data_source.py of {tree} has no line {header.strip()!r} to change")
    path.write_text(text.replace(header, header + "        num_samples = int(num_samples)\n", 1))
    subprocess.run([*git, *GIT_ID, "commit", "-q", "-am", "the pull request"], check=True)
    (tmp / "harness").symlink_to(ROOT)
    real = Path(sys.executable).parent
    venv = tmp / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(
        "#!/bin/bash\n"
        'if [ "$1 $2 $3" = "-m pip install" ]; then shift 3; '
        f'exec {real}/python -m pip install --dry-run --no-index --no-build-isolation "$@"; fi\n'
        f'exec {real}/python "$@"\n'
    )
    (venv / "miles-harness").write_text(
        f'#!/bin/bash\nexport PYTHONPATH={ROOT}\nexec {real}/miles-harness "$@" --scenario sync --fault-seeds 0\n'
    )
    for exe in venv.iterdir():
        exe.chmod(0o755)
    return tmp, base


def _run(tmp: Path, run: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    lines = [line for line in run.splitlines() if not line.startswith("python -m venv")]
    return subprocess.run(
        [*GITHUB_BASH, "-c", "\n".join(lines)],
        cwd=tmp,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.process
def test_the_install_and_gate_steps_run_on_a_git_checkout_and_the_verdict_follows_the_gates_exit(
    pytestconfig, tmp_path
):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tree, how = source.find_miles_src(pytestconfig.getoption("--miles-src", default=None))
    if tree is None:
        pytest.skip(how)
    tmp, base = _workspace(tmp_path, tree)
    done = _run(tmp, install_step()["run"], {})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp / "github_output"
    gate = step("gate")
    env = {"BASE_SHA": base, "GITHUB_OUTPUT": str(out), "ACCEPT_UNRUN": "false"}
    done = _run(tmp, gate["run"], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert out.read_text() == "exit=0\n", done.stdout[-3000:] + done.stderr[-3000:]
    assert "miles/rollout/data_source.py: L" in done.stdout and " ran in 1 case" in done.stdout
    assert (tmp / "gate-out" / "summary.md").read_text().startswith("## Miles async gate: passed")
    assert verdict("0").returncode == 0
