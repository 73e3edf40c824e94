"""The flag names a Miles command line may carry (``known``), and the script that lists them
from a Miles tree and a Megatron-LM tree (``extract``)."""
