import os, sys, time, tempfile
os.environ.setdefault("AUTOTILE_COMPILE_CACHE_DIR", "/tmp/ccbench")
from autotile.codegen import build, kernels
spec = kernels.get("matmul")
names = [n for n in spec.space.named_configs]
out=[]
for n in names[:12]:
    c = spec.space.named_configs[n]
    try:
        src = spec.render(c, "float32", "nn")
    except Exception as e:
        continue
    arch = "sm_90a" if build.needs_arch_specific(src) else "sm_90"
    t=time.perf_counter()
    try: build.compile(src, arch)
    except Exception as e: print(n, e); continue
    out.append((n, time.perf_counter()-t))
for n,t in out: print(f"{n:30s} {t*1000:8.1f} ms")
print("total", sum(t for _,t in out))
