"""The arithmetic of the decode GEMM's RMSNorm members emulated in numpy (A' = bf16(x * g),
fp32 sums, times the row's scale, the output rounded to bf16), against a float64 reference, on
the shapes and value ranges of CudaTest.TheDecodeFamilysRmsNormMembersComputeTheirProblemAtEdgeShapes
(rows scaled by 4^(m % 5 - 2), the last eighth of K by 8 more; uniform +-1 otherwise). It prints,
for the plain and the gated member, how many outputs fall outside the test's tolerance (0 for a
right kernel), the largest error over the tolerance, and how many outputs a kernel would put
outside it whose row scale came from 7/8 of the row's squares (a cluster block's or a warp's
share missing). An earlier form of this emulation, against the test's first tolerance (one
sum's error, not the gated product's), counted 19, 7 and 3 outputs outside it at M=7 N=129
K=4104, M=16 N=129 K=520 and M=16 N=7 K=4104: the pattern the GPU run's tests.log shows.
Usage: python3 emulate_tolerance.py (numpy)"""
import numpy as np

rng = np.random.default_rng(2)


def bf16(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = a.view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


for gated in (False, True):
    for (M, N, K) in [(7, 129, 4104), (16, 129, 520), (16, 7, 4104), (1, 7, 8), (9, 9, 7), (1, 130, 4104), (8, 64, 4096),
                      (16, 2, 520), (1, 33, 1)]:
        X = bf16(rng.uniform(-1, 1, (M, K)))
        G = bf16(rng.uniform(-1, 1, K))
        Bg = bf16(rng.uniform(-1, 1, (N, K)))
        Bu = bf16(rng.uniform(-1, 1, (N, K)))
        rs = np.array([4.0 ** (m % 5 - 2) for m in range(M)])[:, None]
        cs = np.array([8.0 if (k >= K - K // 8 and K >= 8) else 1.0 for k in range(K)])[None, :]
        X = (X * rs * cs).astype(np.float32)
        Xd = X.astype(np.float64)
        r = 1 / np.sqrt((Xd ** 2).mean(1) + 1e-5)
        A = Xd * r[:, None] * G
        g, u = A @ Bg.T, A @ Bu.T
        mg, mu = np.abs(A) @ np.abs(Bg.T), np.abs(A) @ np.abs(Bu.T)
        sil = g / (1 + np.exp(-g))
        w = sil * u if gated else g
        Ak = bf16(X * G)
        rk = (1 / np.sqrt((X ** 2).mean(1) + 1e-5)).astype(np.float32)
        gk, uk = (Ak @ Bg.T) * rk[:, None], (Ak @ Bu.T) * rk[:, None]
        wk = bf16(gk / (1 + np.exp(-gk)) * uk if gated else gk).astype(np.float64)
        sk = np.sqrt(K)
        tol = 2e-2 * (np.abs(w) + np.abs(sil) * mu / sk + np.abs(u) * mg / sk + 1e-2) if gated else \
            2e-2 * (np.abs(w) + mg / sk + 1e-2)
        err = np.abs(wk - w)
        part = X[:, :K - K // 8] if K >= 8 else X
        rk2 = (1 / np.sqrt((part ** 2).sum(1) / K * 8 + 1e-5)).astype(np.float32) if K >= 8 else rk
        gk2, uk2 = (Ak @ Bg.T) * rk2[:, None], (Ak @ Bu.T) * rk2[:, None]
        wk2 = gk2 / (1 + np.exp(-gk2)) * uk2 if gated else gk2
        print("gated" if gated else "plain", M, N, K, "outside the tolerance", int((err > tol).sum()),
              "largest error / tolerance %.2f" % (err / tol).max(),
              "| a scale from 7/8 of the squares: outside at", int((np.abs(wk2 - w) > tol).sum()), "of", w.size)
