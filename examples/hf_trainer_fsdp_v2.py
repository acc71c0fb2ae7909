"""Train a tiny Llama with the Hugging Face Trainer's FSDPv2 (SPMD) under xlarun.

FSDPv2 is torch_xla's SPMD form of fully sharded data parallelism: one process per
host sees every local device, the Trainer builds a ``(devices, 1)`` mesh with axes
``("fsdp", "tensor")``, shards each parameter along ``fsdp`` and splits every batch
along the same axis. ``xlarun --spmd`` starts that one process per host.

On a CPU machine, four virtual devices stand in for accelerators:

    xlarun --spmd --device cpu --virtual-devices 4 examples/hf_trainer_fsdp_v2.py --steps 2

On a single TPU VM (all its chips in one process):

    xlarun --spmd --device tpu examples/hf_trainer_fsdp_v2.py --steps 50

On every host of a multi-host TPU slice on GKE (see ``gke-tpu-job.yaml``), the
same command with ``--cluster gke-tpu``.

The model is built from a configuration and the data are random tokens, so nothing
is downloaded. To adapt it, replace ``tiny_llama`` with
``AutoModelForCausalLM.from_pretrained(...)`` and ``RandomTokens`` with a tokenized
dataset; keep ``fsdp``/``fsdp_config`` as they are. With a real model, name its
decoder layer class in ``fsdp_config["transformer_layer_cls_to_wrap"]`` (the Trainer
falls back to the model's ``_no_split_modules``) and set ``xla_fsdp_grad_ckpt`` to
True to trade compute for memory.

Needs ``transformers`` and ``accelerate`` (the Trainer's device set-up). Prints one
JSON line: the device count, the training loss, and the XLA sharding of the first
decoder layer's query projection (e.g. ``{devices=[4,1]0,1,2,3}``).
"""

import argparse
import json
import tempfile

import torch
import torch_xla
import torch_xla.runtime as xr
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

# FSDPv2 needs SPMD switched on before any XLA tensor exists. torch_xla 2.1 and later expect
# this call rather than XLA_USE_SPMD=1 (which xlarun sets on Neuron only, where import reads it).
if not xr.is_spmd():
    xr.use_spmd()


class RandomTokens(torch.utils.data.Dataset):
    """Fixed random token sequences, labelled with themselves (causal language modelling)."""

    def __init__(self, samples: int, sequence_length: int, vocab_size: int):
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab_size, (samples, sequence_length), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class FsdpV2Trainer(Trainer):
    """A Trainer that makes sure an optimizer exists once FSDPv2 has wrapped the model.

    From transformers 5.3 (still so in 5.24) the Trainer wraps the model in torch_xla's
    FSDP and then never creates the optimizer it delayed until after wrapping, failing
    in ``create_scheduler`` (``'NoneType' object has no attribute 'param_groups'``).
    The optimizer is built here, as earlier versions did, from the ``optim`` argument
    over the model's parameters (FSDPv2 moves and shards them in place, so they are
    the wrapped model's). Where the Trainer already made one, this does nothing.
    """

    def create_scheduler(self, num_training_steps, optimizer=None):
        if optimizer is None and self.optimizer is None:
            self.create_optimizer()
        return super().create_scheduler(num_training_steps=num_training_steps, optimizer=optimizer)


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--batch-per-device",
        type=int,
        default=2,
        help="sequences per device and step; the global batch is this times the device count",
    )
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--output-dir", default=None, help="checkpoints and logs (default: a temporary directory)")
    args = parser.parse_args()

    devices = xr.global_runtime_device_count()
    model = tiny_llama()
    dataset = RandomTokens(args.steps * args.batch_per_device * devices, args.sequence_length, model.config.vocab_size)

    with tempfile.TemporaryDirectory() as scratch:
        training = TrainingArguments(
            output_dir=args.output_dir or scratch,
            # Under SPMD one process feeds the whole mesh: its batch is the global batch,
            # split over the devices along the fsdp axis.
            per_device_train_batch_size=args.batch_per_device * devices,
            max_steps=args.steps,
            learning_rate=1e-3,
            optim="adamw_torch",
            fsdp=True,  # full sharding: transformers 4 reads True as "full_shard", a string 5.24 deprecates
            fsdp_config={"xla": True, "xla_fsdp_v2": True, "xla_fsdp_grad_ckpt": False},
            dataloader_drop_last=True,
            save_strategy="no",
            logging_steps=1,
            report_to=[],
        )
        trainer = FsdpV2Trainer(model=model, args=training, train_dataset=dataset)
        result = trainer.train()

    query = trainer.model.module.model.layers[0].self_attn.q_proj.weight
    print(
        json.dumps(
            {
                "devices": devices,
                "train_loss": result.training_loss,
                "q_proj_sharding": torch_xla._XLAC._get_xla_sharding_spec(query),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
