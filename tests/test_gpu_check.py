"""make gpu-check: on a machine without a GPU it refuses in one line; its checks, rehearsed on
this CPU with a small model, pass and print one table."""

from pathlib import Path

import pytest
import torch

from tests.helpers.in_process import run_in_process


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: gpu-check would run")
def test_without_a_gpu_it_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import gpu_check

    assert gpu_check.main([]) == 2  # `make gpu-check` exits with it (the module's last line)
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "no CUDA GPU" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 11 short trainings and a pair of torchrun nodes
def test_its_checks_rehearsed_on_this_cpu_pass_or_say_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The script's every check on this CPU, small: each of its `python -m runner` commands goes
    through the command line's entry point in this process (tests/helpers/in_process.py), its two
    torchrun nodes are processes of their own, as on a GPU machine. Check 4 writes
    ./conf/hardware/calibrated.yaml where the script runs; its calibration times each product
    and step fewer times than a user's, and measures no link, as on a GPU (its figures are not
    judged on a CPU; test_docs checks a full calibration's)."""
    from benchmarks import gpu_check
    from runner.modes import calibrate

    def runner_here(*args: str, cwd: str | Path, timeout_s: float = 0) -> str:
        done = run_in_process(capfd, *args, cwd=Path(cwd))
        assert done.returncode == 0, f"python -m runner {' '.join(args)}:\n{done.stderr[-3000:]}"
        return done.stdout

    monkeypatch.setattr(gpu_check, "runner", runner_here)
    monkeypatch.setattr(calibrate, "PRODUCT_BUDGET_S", 0.05)
    monkeypatch.setattr(calibrate, "QUICK", calibrate.QUICK | {"max_steps": 4, "warmup_steps": 2})
    # As on a GPU, whose calibration measures no link: a CPU's loopback and DTensor's split step
    # (two more launches of 2 processes) are test_docs' full calibration's to check
    monkeypatch.setattr(calibrate, "link_figures", lambda cfg: {})
    monkeypatch.chdir(tmp_path)
    code = gpu_check.main(["--on-cpu"])
    out = capfd.readouterr().out
    assert code == 0, out
    checks = ("1.", "2.", "3.", "4.", "5.", "6.", "7.")
    rows = [line for line in out.splitlines() if line[:2] in checks]
    assert len(rows) == 14, out
    # What a CPU can judge passes; speed, memory against a GPU's planner figures and the bubble on
    # shared cores say "not judged", and exactly those (32-true is the others' reference)
    unjudged = {row.split("  ")[0] for row in rows if "  not judged  " in row}
    assert unjudged == {"1. one device, 32-true", "1. one device, bf16-mixed compiled",
                        "1. memory peak", "1. cost of measuring", "4. calibrate",
                        "5. pipeline bubble"}, out  # fmt: skip
    assert all("  pass  " in row for row in rows if row.split("  ")[0] not in unjudged), out
    for precision in ("bf16-mixed", "bf16-true", "fp8"):  # check 1: a row each, its loss beside
        assert f"1. one device, {precision} " in out and "against 32-true's" in out
    assert "planned / measured tensors' peak: " in out  # check 1's memory (judged on a GPU)
    assert all(f"{d}: losses within" in out for d in ("sp", "cp", "ep"))  # check 7, each layout
    assert "GPU 0 none sampled" in out  # MLflow's system metrics, the host's alone
    assert "sharing one CPU (two torchrun nodes)" in out  # check 2: the one-GPU machine's path
    assert "2 ranks on this CPU (one launch)" in out  # check 6: the path of two GPUs
    assert "3 steps redone" in out  # of 6, snapshots every 3
    assert (tmp_path / "conf" / "hardware" / "calibrated.yaml").is_file()


def test_a_product_timed_in_a_stall_keeps_a_share_a_profile_accepts() -> None:
    from runner.modes.calibrate import peak_and_curve

    peak, curve = peak_and_curve({32: 3.3e6, 512: 9.0e10, 1024: 1.0e11})  # 32: one call, stalled
    assert peak == 1.0e11 and curve == [[32, 3.3e-05], [512, 0.9], [1024, 1.0]]
