"""Datasets in verl's layout, the prompt sampler and conversions (the built-in tasks are `quartet.tasks`).

Import from the submodules: `quartet.data.prompts.PromptDataset`, `quartet.data.sampler.PromptSampler`,
`quartet.data.reading.read_files`, `quartet.data.errors.DataError`, `quartet.data.convert`. This package
imports nothing itself, so a process that needs one light submodule does not pay for torch, which
`prompts` loads for its batches.
"""

__all__: list[str] = []
