"""Continued pretraining as a small package: the model (:mod:`.model`), held-out evaluation (:mod:`.evaluation`), the
Trainer (:mod:`.trainer`), the time budget (:mod:`.budget`), the ``torchrun`` launch (:mod:`.launch`), a session step
by step (:mod:`.session`) and one run end to end (:mod:`.run`: the pretrain stage and every tournament arm).
"""
