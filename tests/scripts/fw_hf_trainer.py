"""A fine-tuning script on the Hugging Face Trainer, written as its users write them: the
TrainingArguments come from the command line (``--per_device_train_batch_size``,
``--dataloader_num_workers``, ...), the model is built from a config (tiny, nothing downloaded),
the dataset is a plain torch Dataset of tokenised examples. It goes data-parallel by itself when
launched by torchrun (``LOCAL_RANK`` set); run with ``python`` it trains on one process.

    python fw_hf_trainer.py --output_dir /tmp/out --per_device_train_batch_size 16
"""

from dataclasses import dataclass, field

import torch
from transformers import (BertConfig, BertForSequenceClassification, HfArgumentParser, Trainer,
                          TrainingArguments)


@dataclass
class DataArguments:
    num_examples: int = field(default=4096, metadata={"help": "synthetic examples"})
    seq_len: int = field(default=32, metadata={"help": "tokens per example"})


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, vocab, (n, seq_len), generator=g)
        self.labels = (self.ids[:, 0] % 2).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.labels[i]}


def main():
    parser = HfArgumentParser((DataArguments, TrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses()
    config = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=128,
                        max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    train = Synthetic(data_args.num_examples, data_args.seq_len, config.vocab_size)
    trainer = Trainer(model=model, args=training_args, train_dataset=train)
    result = trainer.train()
    if training_args.process_index == 0:
        print(f"train_samples_per_second {result.metrics['train_samples_per_second']}")


if __name__ == "__main__":
    main()
