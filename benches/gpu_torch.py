"""PyTorch's side of benches/gpu.rs, on the same card: the baseline tessera's GPU step is held to.

    python3 benches/gpu_torch.py [--steps N]

Times one training step of the MLP 784-1024-10 at batch 256 (ReLU, softmax cross-entropy,
batch-mean loss, gradient descent 0.01) two ways:

  resident  the variables, the batch and the update on the GPU;
  host      the variables on the host, as a between-graph worker's variables live on a ps:
            copied to the GPU each step, the gradients copied back, the update on the host.
            tessera's `train/gpu` step (variables and update on CPU:0, the tower on GPU:0) is
            this one.

and an n x n float32 MatMul at n = 4096 with its inputs on the GPU (cuBLAS through PyTorch).
Prints one JSON line. Exits 2 without PyTorch or a CUDA device.
"""

import argparse
import json
import sys
import time

BATCH, INPUTS, HIDDEN, CLASSES = 256, 784, 1024, 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_torch: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    gpu = torch.device("cuda")
    torch.manual_seed(1)
    shapes = [(INPUTS, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,)]
    host_params = [torch.randn(s) * 0.1 for s in shapes]
    x_host = torch.randn(BATCH, INPUTS)
    labels_host = torch.arange(BATCH) % CLASSES

    def loss_of(params, x, labels):
        w1, b1, w2, b2 = params
        h = torch.relu(x @ w1 + b1)
        return torch.nn.functional.cross_entropy(h @ w2 + b2, labels)

    def resident_steps(count):
        params = [p.to(gpu).requires_grad_() for p in host_params]
        x, labels = x_host.to(gpu), labels_host.to(gpu)

        def step():
            loss = loss_of(params, x, labels)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= 0.01 * g
            return loss

        return timed(step, count, torch)

    def host_steps(count):
        params = [p.clone() for p in host_params]

        def step():
            on_gpu = [p.to(gpu, non_blocking=False).requires_grad_() for p in params]
            loss = loss_of(on_gpu, x_host.to(gpu), labels_host.to(gpu))
            grads = torch.autograd.grad(loss, on_gpu)
            for p, g in zip(params, grads):
                p -= 0.01 * g.cpu()
            return loss.item()

        return timed(step, count, torch)

    def matmul(n, count):
        a = torch.randn(n, n, device=gpu)
        b = torch.randn(n, n, device=gpu)
        seconds = timed(lambda: a @ b, count, torch)
        return 2.0 * n**3 / seconds / 1e12

    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "mlp_step_ms_resident": resident_steps(args.steps) * 1e3,
        "mlp_step_ms_host_variables": host_steps(args.steps) * 1e3,
        "matmul_4096_tflops": matmul(4096, 50),
    }
    print(json.dumps(result))
    return 0


def timed(step, count, torch):
    """Median seconds per call of `step` over 5 runs of `count` calls, after a warm-up."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(count):
            step()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - began) / count)
    return sorted(runs)[len(runs) // 2]


if __name__ == "__main__":
    sys.exit(main())
