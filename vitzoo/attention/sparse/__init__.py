"""Fixed sparse patterns: ``local``, ``dilated``, ``global_tokens``, ``longformer``, ``bigbird`` and
``multi_pattern``. Shared pieces: :mod:`.pattern` (index buffers and the base class), :mod:`.neighbourhood`
(neighbourhood head groups), :mod:`.geometry` (2-D neighbourhood indices and masks), :mod:`.halo` and
:mod:`.gather` (blocked attention), :mod:`.flex` (FlexAttention).
"""
