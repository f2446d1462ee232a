"""dcr inside the engines and trainers people run.

Each module is written from the documented interface of one framework and imports it only when
asked (:func:`dcr.adapters.vllm.register` imports vLLM); importing :mod:`dcr.adapters` needs none of
them. :mod:`dcr.adapters.engine` holds what the engine-side adapters share: :class:`EngineSync`
keeps one engine's weights at a version, and :class:`DeltaSender` is the trainer side that turns
successive state dicts into delta files.
"""
