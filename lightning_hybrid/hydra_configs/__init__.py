"""Config groups for a Hydra project of one's own, reached through ``hydra.searchpath``
(``pkg://lightning_hybrid.hydra_configs``): ``callbacks/hybrid.yaml`` is the plugin as one entry of a ``callbacks``
dict, in the shape of lightning-hydra-template."""
