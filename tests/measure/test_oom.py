"""Reading CUDA out-of-memory messages: both formats torch prints, and the diagnosis they lead to."""

from __future__ import annotations

import pytest

from helpers.measure.oom import OOMReport, format_size, parse_size, read_oom_message

GIB, MIB = 2**30, 2**20

# The torch >= 2.1 format, as CUDACachingAllocator prints it (numbers of our own choosing).
NEW = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.54 GiB of which "
       "1.06 GiB is free. Including non-PyTorch memory, this process has 22.47 GiB memory in use. Of the "
       "allocated memory 19.80 GiB is allocated by PyTorch, and 2.04 GiB is reserved by PyTorch but "
       "unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
       "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
# Another process beside this one: torch matched this process's PID (os.getpid()) in NVML's list.
OTHERS = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 1 has a total "
          "capacity of 79.25 GiB of which 100.50 MiB is free. Process 4321 has 30.00 GiB memory in use. "
          "Including non-PyTorch memory, this process has 49.10 GiB memory in use. Of the allocated memory "
          "48.00 GiB is allocated by PyTorch, and 600.00 MiB is reserved by PyTorch but unallocated.")
# The same GPU seen from inside a container: NVML names this process by its host PID (4322), which
# is not os.getpid() there, so the message has no "this process" part (the case of issue 37).
CONTAINER = OTHERS.replace("Including non-PyTorch memory, this process has", "Process 4322 has")
# Two listed processes each at least as large as what PyTorch reserved here: either may be this one.
AMBIGUOUS = CONTAINER.replace("Process 4321 has 30.00 GiB", "Process 4321 has 60.00 GiB").replace(
    "79.25 GiB of which 100.50 MiB", "159.25 GiB of which 100.50 MiB")
CAPPED = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.25 GiB of which "
          "60.00 GiB is free. Including non-PyTorch memory, this process has 16.40 GiB memory in use. "
          "15.00 GiB allowed; Of the allocated memory 14.90 GiB is allocated by PyTorch, and 30.00 MiB is "
          "reserved by PyTorch but unallocated.")
OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; "
       "6.35 GiB already allocated; 47.06 MiB free; 7.50 GiB reserved in total by PyTorch) If reserved "
       "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")


def test_sizes_read_and_print_as_the_allocator_does() -> None:
    assert parse_size("2.00 GiB") == 2 * GIB
    assert parse_size("512.00 MiB") == 512 * MIB
    assert parse_size("20 bytes") == 20
    assert format_size(2 * GIB) == "2.00 GiB" and format_size(1536 * 1024) == "1.50 MiB"
    assert format_size(512) == "512 bytes"
    with pytest.raises(ValueError, match="2.00 GiB"):
        parse_size("two gigs")


def test_the_new_format_gives_every_number() -> None:
    r = read_oom_message(NEW)
    assert r.style == "torch>=2.1"
    assert (r.requested, r.free) == (2 * GIB, parse_size("1.06 GiB"))
    assert r.total == parse_size("23.54 GiB")
    assert r.allocated == parse_size("19.80 GiB")
    assert r.reserved_unallocated == parse_size("2.04 GiB")
    assert r.reserved == parse_size("19.80 GiB") + parse_size("2.04 GiB")
    # this process holds 22.47 GiB; the allocator 21.84 of it: 0.63 GiB is the CUDA context and libraries
    assert r.outside_pytorch == parse_size("22.47 GiB") - r.reserved
    assert r.other_processes == 0 and r.allowed is None


def test_line_breaks_of_a_pasted_log_do_not_matter() -> None:
    assert read_oom_message(NEW.replace(". ", ".\n  ")) == read_oom_message(NEW)


def test_other_processes_and_a_cap_are_read() -> None:
    others = read_oom_message(OTHERS)
    assert others.other_processes == parse_size("30.00 GiB") and others.processes == ((4321, 30 * GIB),)
    assert others.process_in_use == parse_size("49.10 GiB") and others.own_pid is None
    capped = read_oom_message(CAPPED)
    assert capped.allowed == 15 * GIB and capped.capacity == 15 * GIB


def test_the_old_format_is_read_too() -> None:
    r = read_oom_message(OLD)
    assert r.style == "torch<2.1"
    assert r.allocated == parse_size("6.35 GiB")
    assert r.reserved == parse_size("7.50 GiB")  # reserved in total = allocated + cached
    assert r.free == parse_size("47.06 MiB") and r.requested == 36 * MIB


def test_the_diagnosis_names_what_ran_out() -> None:
    frag = read_oom_message(NEW).diagnosis()  # 2.04 GiB cached, more than the 2 GiB asked for
    assert any("fragmentation" in line and "expandable_segments:True" in line for line in frag)
    assert any("Live tensors hold 19.80 GiB" in line for line in frag)
    others = read_oom_message(OTHERS).diagnosis()
    assert "Other processes hold 30.00 GiB" in others[0]
    capped = read_oom_message(CAPPED).diagnosis()
    assert len(capped) == 1 and "of 15.00 GiB" in capped[0]  # the cap, not the card, is what is full
    huge = OOMReport(requested=100 * GIB, total=80 * GIB, free=70 * GIB, allocated=GIB,
                     reserved_unallocated=0).diagnosis()
    assert "no freeing helps" in huge[0]
    assert not any("fragmentation" in line for line in huge)


def test_in_a_container_this_process_is_not_taken_for_another() -> None:
    """NVML names processes by host PID; inside a container that is not os.getpid(), so torch writes
    "Process 4322 has ..." for this very process. The page must not tell you to stop it."""
    r = read_oom_message(CONTAINER)
    assert r.own_pid == 4322 and r.own_pid_candidates == (4322,)
    assert r.process_in_use == parse_size("49.10 GiB") and r.other_processes == 30 * GIB
    assert r.outside_pytorch == read_oom_message(OTHERS).outside_pytorch  # as if torch had matched it
    lines = r.diagnosis()
    assert "Process 4322" in lines[0] and "do not stop it" in lines[0] and "os.getpid()" in lines[0]
    assert any("Other processes hold 30.00 GiB" in line for line in lines)
    assert not any("79.10 GiB" in line for line in lines)  # the old reading: both processes "others"
    assert any("read as this process" in what for what, _ in r.rows())


def test_when_two_listed_processes_could_be_this_one_the_page_says_so() -> None:
    r = read_oom_message(AMBIGUOUS)
    assert r.own_pid_candidates == (4322, 4321) and r.own_pid == 4322  # the smaller one is taken
    lines = r.diagnosis()
    assert "Processes 4322, 4321" in lines[0] and "before you stop one" in lines[0]
    assert any(line.startswith("Other processes may hold 60.00 GiB") for line in lines)
    assert not any("stop them" in line for line in lines)


def test_no_listed_process_can_be_this_one_when_each_is_smaller_than_its_reserved_memory() -> None:
    small = CONTAINER.replace("Process 4322 has 49.10 GiB", "Process 4322 has 1.00 GiB")
    r = read_oom_message(small)
    assert r.own_pid is None and r.process_in_use is None
    assert r.other_processes == 31 * GIB


def test_the_advice_names_both_allocator_variables_and_the_peak_caveat() -> None:
    from helpers.measure.oom import ALLOCATOR_SETTINGS

    lines = read_oom_message(NEW).diagnosis()
    frag = next(line for line in lines if "fragmentation" in line)
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in frag and "PYTORCH_CUDA_ALLOC_CONF" in frag
    assert "max_split_size_mb" in frag
    live = next(line for line in lines if line.startswith("Live tensors"))
    # 19.80 GiB allocated + the 2.00 GiB request: the least the step needs, not its peak
    assert "not the peak" in live and "at least 21.80 GiB" in live
    assert {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:N",
            "garbage_collection_threshold:F"} <= set(ALLOCATOR_SETTINGS)


def test_the_installed_torch_reads_both_allocator_variables() -> None:
    """The order ALLOCATOR_SETTINGS states, read from the installed torch's own header (torch 2.13; 2.5
    reads the CUDA name only)."""
    import re
    from pathlib import Path

    import torch

    header = Path(torch.__file__).parent / "include" / "c10" / "cuda" / "CUDAAllocatorConfig.h"
    if not header.exists():
        pytest.skip(f"this torch ships no {header.name}")
    names = re.findall(r'(?:get_env|getenv)\("(PYTORCH_[A-Z]*_?ALLOC_CONF)"\)', header.read_text())
    assert "PYTORCH_CUDA_ALLOC_CONF" in names, names
    if "PYTORCH_ALLOC_CONF" not in names:  # the page says the generic name came with torch 2.8
        assert tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 8), (torch.__version__, names)
        return
    assert names.index("PYTORCH_CUDA_ALLOC_CONF") < names.index("PYTORCH_ALLOC_CONF"), names


def test_not_an_oom_message_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a CUDA out-of-memory message"):
        read_oom_message("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    with pytest.raises(TypeError, match="str"):
        read_oom_message(123)  # type: ignore[arg-type]


def test_lesson_00_states_the_decision_rule_word_for_word() -> None:
    import json
    from pathlib import Path

    from helpers.plan import planner

    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "00_start_here.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for step in (*planner.DECISION_RULE, planner.RULE_COROLLARY):
        assert step in markdown, step
