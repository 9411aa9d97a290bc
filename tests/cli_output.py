"""What a typer CliRunner result printed on stderr (older click mixes it into ``output``)."""


def stderr_of(res) -> str:
    try:
        return res.stderr
    except (ValueError, AttributeError):
        return res.output
