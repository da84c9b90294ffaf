"""What a result records about the machine it ran on."""

from __future__ import annotations

from runner.devices import describe_cpuinfo

# The first lines of /proc/cpuinfo on two EPYC hosts that both call themselves "AMD EPYC" (abridged flags).
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx fma avx2 sha_ni

processor\t: 1
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx fma avx2 sha_ni
"""
ZEN4 = ZEN3.replace("model\t\t: 1", "model\t\t: 17").replace("avx2 sha_ni", "avx2 avx512f avx512_bf16 sha_ni")


def test_cpu_record_tells_apart_hosts_with_the_same_name():
    assert describe_cpuinfo(ZEN3) == "AMD EPYC (family 25 model 1), avx2"
    assert describe_cpuinfo(ZEN4) == "AMD EPYC (family 25 model 17), avx2, avx512f, avx512_bf16"


def test_cpu_record_says_so_when_fields_are_missing():
    assert describe_cpuinfo("processor\t: 0\nflags\t: fpu sse4_2\n") == "? (family ? model ?), no avx2"
