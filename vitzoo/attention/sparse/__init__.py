"""Fixed sparse patterns: ``local``, ``dilated``, ``global_tokens``, ``longformer``, ``bigbird`` and
``multi_pattern``. Shared pieces: :mod:`.pattern` (index buffers and the base class), :mod:`.neighbourhood`
(neighbourhood head groups), :mod:`.geometry` (2-D neighbourhood indices and masks), :mod:`.halo` (query blocks
and halos), :mod:`.flex` (FlexAttention); the blocked kernels are :mod:`vitzoo.ops.halo` and :mod:`vitzoo.ops.gather`.
"""
