"""Factories a YAML recipe delegates to by name (`factory: recipe_factories_example:NAME`),
for test_recipe_factories.py and tests/recipes/good_factory_rule.yaml."""
from qrecipe import formats


def first_layer(role):
    """The first layer's weights in MXFP8, its other tensors in high precision."""
    return formats.mxfp8() if role.tensor_type == "weight" else None


class Factories:
    @staticmethod
    def by_shape(role):
        """Wide weights in NVFP4 (16x16 tiles), everything else float8."""
        if role.tensor_type == "weight" and role.shape[1] >= 64:
            return formats.nvfp4(two_d=True)
        return formats.float8()


NOT_A_FUNCTION = 3
