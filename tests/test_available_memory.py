"""available_memory (models/shards.py): the memory a load may take is the least of the machine's MemAvailable and
every cgroup level's limit - usage, so a container's limit refuses an oversized model in one line instead of the
kernel killing the process. Fake /proc and /sys trees, both cgroup layouts."""

from __future__ import annotations

from pathlib import Path

from ctxrep.models.shards import available_memory

GIB = 2**30


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_without_a_cgroup_limit_it_is_memavailable(tmp_path):
    root = _tree(
        tmp_path,
        {
            "proc/meminfo": "MemTotal: 20971520 kB\nMemAvailable: 10485760 kB\n",
            "proc/self/cgroup": "0::/job\n",
            "sys/fs/cgroup/job/memory.max": "max\n",
            "sys/fs/cgroup/job/memory.current": "123\n",
        },
    )
    assert available_memory(root) == 10 * GIB


def test_a_cgroup_v2_limit_at_any_level_caps_it(tmp_path):
    root = _tree(
        tmp_path,
        {
            "proc/meminfo": "MemAvailable: 10485760 kB\n",
            "proc/self/cgroup": "0::/jobs/one\n",
            "sys/fs/cgroup/jobs/one/memory.max": "max\n",
            "sys/fs/cgroup/jobs/one/memory.current": f"{GIB}\n",
            "sys/fs/cgroup/jobs/memory.max": f"{4 * GIB}\n",
            "sys/fs/cgroup/jobs/memory.current": f"{3 * GIB}\n",
        },
    )
    assert available_memory(root) == GIB


def test_a_cgroup_v1_memory_limit_caps_it_and_its_no_limit_number_does_not(tmp_path):
    files = {
        "proc/meminfo": "MemAvailable: 10485760 kB\n",
        "proc/self/cgroup": "4:memory:/box\n3:cpu:/\n0::/\n",
        "sys/fs/cgroup/memory/box/memory.limit_in_bytes": f"{2 * GIB}\n",
        "sys/fs/cgroup/memory/box/memory.usage_in_bytes": f"{GIB // 2}\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": "5\n",
    }
    assert available_memory(_tree(tmp_path / "a", files)) == GIB + GIB // 2
    files["sys/fs/cgroup/memory/box/memory.limit_in_bytes"] = "9223372036854771712\n"
    assert available_memory(_tree(tmp_path / "b", files)) == 10 * GIB


def test_nothing_readable_is_unknown(tmp_path):
    assert available_memory(tmp_path) is None
