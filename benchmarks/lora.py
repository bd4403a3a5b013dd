"""Training throughput of one LoRA step, and the GPU-hours of the paper's LoRA protocol (README "Speed").

1. The demo's LoRA-adaptable networks on the CPU (:func:`crsrepro.run.lora.adapt` and the training step of
   :func:`crsrepro.run.lora.train`: forward, loss, backward, AdamW step) at the demo's batch size.
2. On a GPU (when ``torch.cuda.is_available()``): ViT-B/16 at 224 px, bf16 autocast, batch 128, LoRA
   rank 8 on the attention projections (``attn.qkv``, ``attn.proj``), randomly initialised (timm,
   ``pretrained=False``: the weights do not change the speed, and nothing is downloaded).
3. The GPU-hours of the paper's protocol (43 cells x 3 seeds x 5 label regimes, each trained for the steps of 8 epochs of the full train split,
   :func:`crsrepro.run.plan.paper_gpu_hours`) from the GPU throughput measured here, or, without a GPU,
   from the planner's documented rate (``crsrepro.run.plan.THROUGHPUTS``: the ~3,100 img/s that a measurement outside this repository
   quotes for one H200, not measured here).

Usage::

    python benchmarks/lora.py                # CPU demo networks (+ the GPU path when a GPU is present)
    python benchmarks/lora.py --threads 1    # on a machine shared with other jobs
    python benchmarks/lora.py --steps 20 --gpu-batch 128
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from crsrepro.encoders import create_encoder
from crsrepro.run.lora import LoraParams, _embed, _loss, adapt, adaptable
from crsrepro.run.plan import paper_gpu_hours
from crsrepro.run.plan import THROUGHPUTS
from crsrepro.profiles import load_profile

N_CLASSES = 5  # [ours] APTOS's five grades; the head's size does not change the step's cost


def step_throughput(step, batch_size: int, steps: int, warmup: int = 2, sync=lambda: None) -> float:
    """Images per second of ``step()`` (one optimiser step on ``batch_size`` images), after ``warmup``."""
    for _ in range(warmup):
        step()
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return batch_size * steps / (time.perf_counter() - started)


def demo_step(encoder_id: str, batch_size: int):
    """One LoRA training step of a demo network on a random uint8 batch, as :func:`crsrepro.run.lora.train` runs it."""
    adapted = adapt(create_encoder(encoder_id), seed=0)
    head = torch.nn.Linear(adapted.spec.embed_dim, N_CLASSES)
    params = [p for p in adapted.model.parameters() if p.requires_grad] + list(head.parameters())
    optimiser = torch.optim.AdamW(params, lr=1e-3)
    size = adapted.spec.input_size
    x = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8)
    y = torch.randint(0, N_CLASSES, (batch_size,))

    def step():
        _loss(head(_embed(adapted, x)), y, "multiclass").backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
    return step


def vit_b16_gpu_step(batch_size: int):
    """One LoRA step of ViT-B/16 (224 px, bf16 autocast, channels-last input) on the GPU."""
    import timm
    from peft import LoraConfig, inject_adapter_in_model

    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0).cuda().eval()
    inject_adapter_in_model(LoraConfig(r=8, lora_alpha=16, target_modules=["attn.qkv", "attn.proj"]), model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    head = torch.nn.Linear(768, N_CLASSES).cuda()
    params = [p for p in model.parameters() if p.requires_grad] + list(head.parameters())
    optimiser = torch.optim.AdamW(params, lr=1e-3, fused=True)
    x = torch.randn(batch_size, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, N_CLASSES, (batch_size,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(head(model(x)).float(), y)
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per network (after 2 warm-up steps)")
    parser.add_argument("--batch", type=int, default=LoraParams().batch_size, help="CPU batch size")
    parser.add_argument("--gpu-batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-cpu", action="store_true", help="skip the demo networks")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.no_cpu:
        print(f"LoRA step throughput on the CPU ({torch.get_num_threads()} threads), batch {args.batch}:")
        for encoder_id in adaptable(load_profile("demo").encoders):
            rate = step_throughput(demo_step(encoder_id, args.batch), args.batch, args.steps)
            print(f"  {encoder_id:22s} {rate:8.1f} img/s")
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        rate = step_throughput(vit_b16_gpu_step(args.gpu_batch), args.gpu_batch, max(args.steps, 20), warmup=5,
                               sync=torch.cuda.synchronize)
        source = f"measured here on {torch.cuda.get_device_name()}"
    else:
        quoted = THROUGHPUTS["gpu_lora_vit_b16"]
        rate, source = quoted.value, f"not measured here (no GPU): {quoted.source}"
    print(f"ViT-B/16 LoRA step, bf16, batch {args.gpu_batch}: {rate:,.0f} img/s ({source})")
    print(f"the paper's LoRA protocol (43 cells x 3 seeds x 5 label regimes, each the steps of 8 full epochs): "
          f"{paper_gpu_hours(rate):.1f} GPU-hours at {rate:,.0f} img/s")
    print(f"  (one epoch = one pass over the cell's train split at the label fraction; "
          f"{np.round(paper_gpu_hours(rate, fractions=(1.0,)), 1)} GPU-hours of it at 100 % labels)")


if __name__ == "__main__":
    main()
