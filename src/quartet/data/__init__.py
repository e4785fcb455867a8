"""Datasets in verl's layout, the prompt sampler, conversions and built-in synthetic tasks.

Import from the submodules: `quartet.data.prompts.PromptDataset`, `quartet.data.sampler.PromptSampler`,
`quartet.data.reading.read_files`, `quartet.data.errors.DataError`, `quartet.data.convert`,
`quartet.data.tasks`. This package imports nothing itself, so reward-scoring workers that only need a task's
verifier (`quartet.data.tasks`) do not pay for torch, which `prompts` loads for its batches.
"""

__all__: list[str] = []
