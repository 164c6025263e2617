"""The models the lessons train and plan: the lessons' GPT and small nets, the released architectures
(GPT-2, Llama, Mistral, Qwen2) op for op, and which parameters train (LoRA).

Imports: core.
"""
