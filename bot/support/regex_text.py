"""Reading a regular expression's text without compiling it (start-up: compiling is what is put off)."""


def top_level_alternative(pattern: str) -> bool:
    """Whether the pattern has a `|` outside every group and character class (each alternative may
    then match different text, so no literal is common to all its matches)."""
    depth, in_class, i = 0, False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":  # a ']' first in a class is a member
                i += 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            return True
        i += 1
    return False
