#!/usr/bin/env python3
"""Checks the JSON Schemas in schemas/ with a JSON Schema validator nobody here wrote.

  check_schemas.py                 every example under schemas/examples/<contract>/{valid,invalid}
                                   must validate, or fail to, as its folder says
  check_schemas.py CONTRACT FILE…  every FILE must be valid against schemas/<CONTRACT>.schema.json

Exits 0 when everything agrees, 1 otherwise, printing one line per disagreement.
"""
import json
import pathlib
import sys

try:
    import jsonschema
except ImportError:
    sys.exit("check_schemas.py needs the Python jsonschema package (apt-get install python3-jsonschema)")

root = pathlib.Path(__file__).resolve().parent.parent / "schemas"


def validator(contract):
    schema = json.loads((root / f"{contract}.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def main(argv):
    problems = []
    checked = 0
    if len(argv) >= 2:
        v = validator(argv[0])
        for name in argv[1:]:
            checked += 1
            errors = list(v.iter_errors(json.loads(pathlib.Path(name).read_text())))
            if errors:
                problems.append(f"{name}: not a valid {argv[0]}: {errors[0].message}")
    else:
        for contract_dir in sorted((root / "examples").iterdir()):
            v = validator(contract_dir.name)
            for expected in ("valid", "invalid"):
                for example in sorted((contract_dir / expected).glob("*.json")):
                    checked += 1
                    ok = not list(v.iter_errors(json.loads(example.read_text())))
                    if ok != (expected == "valid"):
                        problems.append(f"{example.relative_to(root)}: schema says {'valid' if ok else 'invalid'}, folder says {expected}")
    for line in problems:
        print(line)
    print(f"check_schemas: {checked} instances checked, {len(problems)} disagreements")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
