"""Training throughput of one LoRA step, and the GPU-hours of the paper's LoRA protocol (README "Speed").

1. The demo's LoRA-adaptable networks on the CPU (:func:`crsrepro.run.lora.adapt` and the training step of
   :func:`crsrepro.run.lora.train`: forward, loss, backward, AdamW step) at the demo's batch size.
2. On a GPU (when ``torch.cuda.is_available()``): ViT-B/16 at 224 px, bf16 autocast, batch 128, LoRA
   rank 8 on the attention projections (``attn.qkv``, ``attn.proj``), randomly initialised (timm,
   ``pretrained=False``: the weights do not change the speed, and nothing is downloaded).
3. ``--scoring``: what scoring a fine-tune costs, side by side in one run: the adapted network's forward
   as peft runs it (the base and the adapter paths) and with the adapters merged into the base weights
   (:func:`crsrepro.run.lora.merged`, what :func:`crsrepro.run.lora.score` embeds with), on the same images
   (the demo's 240 test images x 19 conditions is about 5,000 per fine-tune), with the largest difference
   between the two embeddings relative to their largest value. The adapters' B matrices are drawn at random
   (peft starts them at zero, where merging changes nothing).
4. The GPU-hours of the paper's protocol (43 cells x 3 seeds x 5 label regimes, each trained for the steps of 8 epochs of the full train split,
   :func:`crsrepro.run.plan.paper_gpu_hours`) from the GPU throughput measured here, or, without a GPU,
   from the planner's documented rate (``crsrepro.run.plan.THROUGHPUTS``: the ~3,100 img/s that a measurement outside this repository
   quotes for one H200, not measured here).

Usage::

    python benchmarks/lora.py                # CPU demo networks (+ the GPU path when a GPU is present)
    python benchmarks/lora.py --threads 1    # on a machine shared with other jobs
    python benchmarks/lora.py --steps 20 --gpu-batch 128
    python benchmarks/lora.py --scoring      # scoring: peft's forward against the merged network (CPU, 1 thread)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from crsrepro.encoders import create_encoder
from crsrepro.run.lora import LoraParams, _embed, _features, _loss, adapt, adaptable, merged
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


def scoring_side_by_side(encoder_id: str, n_images: int, batch_size: int) -> tuple[float, float, float]:
    """(peft's forward seconds, the merged network's seconds, largest relative difference) embedding
    ``n_images`` random images with an adapted demo network whose adapters are not zero."""
    adapted = adapt(create_encoder(encoder_id), seed=0)
    with torch.no_grad():
        for name, p in adapted.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(0))
    size = adapted.spec.input_size
    images = torch.randint(0, 256, (n_images, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    started = time.process_time()
    unmerged = _features(adapted, images, batch_size)
    peft_seconds = time.process_time() - started
    started = time.process_time()
    network = merged(adapted)
    merged_features = _features(network, images, batch_size)
    merged_seconds = time.process_time() - started
    return peft_seconds, merged_seconds, float(np.abs(unmerged - merged_features).max() / np.abs(unmerged).max())


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
    parser.add_argument("--scoring", action="store_true", help="only the scoring forward, peft's against merged")
    parser.add_argument("--images", type=int, default=2048, help="images embedded per network with --scoring")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.scoring:
        torch.set_num_threads(args.threads or 1)
        print(f"scoring forward of {args.images} images on the CPU ({torch.get_num_threads()} thread), CPU seconds:")
        for encoder_id in adaptable(load_profile("demo").encoders):
            peft_seconds, merged_seconds, difference = scoring_side_by_side(encoder_id, args.images,
                                                                            load_profile("demo").features.batch_size)
            print(f"  {encoder_id:22s} peft {peft_seconds:6.2f} s  merged {merged_seconds:6.2f} s  "
                  f"x{peft_seconds / merged_seconds:4.2f}  largest relative difference {difference:.1e}")
        return
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
