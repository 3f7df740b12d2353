#!/usr/bin/env python3
"""Checks the packaging of apns-fleet against its sources, without Docker or Kubernetes.

    python3 scripts/check_packaging.py            # check the tree, then prove the check can fail
    python3 scripts/check_packaging.py --no-self-test
    python3 scripts/check_packaging.py --root DIR  # check another copy of the tree

Every YAML file under docker/ and deploy/ is parsed with PyYAML, the Grafana dashboard with json.
The facts they are checked against come from the Swift sources, never from a list kept here:

- configuration keys, their defaults and choices: Sources/APNsFleetConfig/ConfigurationKeys.swift;
- environment variable names: the prefix and the character rule in ConfigurationLoader.swift;
- subcommands and their flags: the ParsableCommands under Sources/apns-fleet (+ APNsFleet.swift);
- simulator ports: SimulatorCommand.swift; the worker's stop budget: WorkerCommand.swift;
- exported metrics: the swift-metrics label strings in the modules the worker links, named as
  swift-prometheus names them (invalid characters become '_'; a Timer is a histogram in seconds
  with _bucket/_sum/_count series; counters get no _total suffix).

Optional extra checks run when their tool is present: `kubectl kustomize` renders every
kustomization; the built binary (.build/debug/apns-fleet) loads every fleet config file through
the real configuration loader (`apns-fleet validate-job --config`).

After checking the tree, the script copies it and breaks each copy in one known way (a wrong
probe path, an unknown APNS_FLEET_ variable, a dashboard metric the worker does not export, ...);
each broken copy must fail. Exit status: 0 when everything holds, 1 with one line per problem,
naming the file, otherwise.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    print("check_packaging: PyYAML is missing (Debian: apt-get install python3-yaml)", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------
# Facts from the Swift sources
# ---------------------------------------------------------------------------------------------


class SourceFacts:
    """What the Swift sources say: configuration keys, commands, metrics, stop budget."""

    def __init__(self, root: Path, problem):
        self.root = root
        self.problem = problem
        self._config_keys()
        self._env_rule()
        self._commands()
        self._feedback_rules()
        self._simulator_ports()
        self._stop_budget()
        self._metrics()

    # Configuration -----------------------------------------------------------------------

    def _config_keys(self):
        path = self.root / "Sources/APNsFleetConfig/ConfigurationKeys.swift"
        text = read(path)
        self.keys: dict[str, dict] = {}
        pattern = re.compile(r'\.init\(\s*"([^"]+)"\s*,\s*"((?:[^"\\]|\\.)*)"\s*,\s*"((?:[^"\\]|\\.)*)"')
        for name, type_, default in pattern.findall(text):
            self.keys[name] = {"type": type_, "default": default}
        if len(self.keys) < 10 or "admin.port" not in self.keys:
            self.problem(path, "cannot read the configuration key catalogue (expected .init(\"key\", \"type\", \"default\", ...))")
        self.plain_keys = {k for k in self.keys if not k.startswith("app.<name>.")}
        self.app_suffixes = {k[len("app.<name>."):] for k in self.keys if k.startswith("app.<name>.")}

    def _env_rule(self):
        path = self.root / "Sources/APNsFleetConfig/ConfigurationLoader.swift"
        text = read(path)
        prefix = re.search(r'environmentPrefix\s*=\s*"([^"]+)"', text)
        body = re.search(r"func bareEnvironmentName\(for key: String\) -> String \{(.*?)\n    \}", text, re.S)
        self.env_prefix = prefix.group(1) if prefix else "APNS_FLEET_"
        # The rule mirrored below (swift-configuration's): per dotted component, "_" at each
        # lower-to-upper step, upper-cased, everything but letters and digits as "_".
        if not prefix or not body or not all(part in body.group(1) for part in ("isLowercase", "isUppercase", "uppercased()", "isLetter || $0.isNumber")):
            self.problem(path, "bareEnvironmentName(for:) no longer follows the rule check_packaging.py mirrors; update scripts/check_packaging.py")

    def env_name(self, key: str) -> str:
        def component(text: str) -> str:
            text = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", text)
            return "".join(c if c.isalnum() else "_" for c in text.upper())
        return self.env_prefix + "_".join(component(part) for part in key.split("."))

    def key_for_env(self, name: str, apps: list[str]) -> tuple[str | None, str | None]:
        """(key, problem) for an APNS_FLEET_ variable; app keys resolve against `apps`."""
        for key in self.plain_keys:
            if self.env_name(key) == name:
                return key, None
        app_prefix = self.env_prefix + "APP_"
        if name.startswith(app_prefix):
            for app in apps:
                for suffix in self.app_suffixes:
                    if name == self.env_name(f"app.{app}.{suffix}"):
                        return f"app.{app}.{suffix}", None
            for suffix in sorted(self.app_suffixes, key=len, reverse=True):
                tail = "_" + self.env_name(suffix)[len(self.env_prefix):]
                if name.endswith(tail) and len(name) > len(app_prefix) + len(tail):
                    app = name[len(app_prefix):-len(tail)]
                    return None, f"sets app.<name>.{suffix} for an app whose environment name is {app}, which is not in apps ({', '.join(apps) or 'none'})"
        names = [self.env_name(k) for k in self.plain_keys] + [
            self.env_name(f"app.{a}.{s}") for a in apps for s in self.app_suffixes]
        close = difflib.get_close_matches(name, names, n=1)
        return None, "is no configuration key" + (f" (did you mean {close[0]}?)" if close else "")

    def choices(self, key_template: str) -> list[str] | None:
        type_ = self.keys.get(key_template, {}).get("type", "")
        if " | " in type_:
            return [c.strip() for c in type_.split("|")]
        return None

    # Commands ----------------------------------------------------------------------------

    @staticmethod
    def _declared_flags(text: str) -> set[str]:
        """The long (and short) flags declared with @Option/@Flag anywhere in `text`."""
        flags = set()
        for option in re.finditer(r"@(Option|Flag)\s*\(", text):
            args = balanced(text, option.end() - 1)
            var = re.match(r"\s*(?:var|let)\s+(\w+)", text[option.end() - 1 + len(args):])
            if not var:
                continue
            custom = re.search(r'customLong\("([^"]+)"\)', args)
            flags.add("--" + (custom.group(1) if custom else kebab(var.group(1))))
            short = re.search(r"customShort\(\"(.)\"\)", args)
            if short:
                flags.add("-" + short.group(1))
            if ".shortAndLong" in args:
                flags.add("-" + var.group(1)[0])
        return flags

    def _commands(self):
        directory = self.root / "Sources/apns-fleet"
        main = read(self.root / "Sources/apns-fleet/APNsFleet.swift")
        sources = {path: read(path) for path in sorted(directory.rglob("*.swift"))}
        # Option groups (`struct X: ParsableArguments`) that commands include with @OptionGroup.
        groups: dict[str, set[str]] = {}
        for text in sources.values():
            for group in re.finditer(r"struct (\w+)\s*:\s*ParsableArguments", text):
                groups[group.group(1)] = self._declared_flags(text)
        self.commands: dict[str, dict] = {}
        for path, text in sources.items():
            for struct in re.finditer(r"struct (\w+)\s*:\s*(?:Async)?ParsableCommand", text):
                name = re.search(r'commandName:\s*"([^"]+)"', text[struct.end():])
                if not name:
                    continue
                flags = {"--help", "-h", "--version"} | self._declared_flags(text)
                for included in re.finditer(r"@OptionGroup\s+var\s+\w+\s*:\s*(\w+)", text):
                    flags |= groups.get(included.group(1), set())
                self.commands[name.group(1)] = {
                    "struct": struct.group(1),
                    "file": path,
                    "flags": flags,
                    "registered": re.search(r"\b" + struct.group(1) + r"\.self", main) is not None,
                    "takes_flag_values": {f for f in flags if f not in ("--help", "-h", "--version")},
                }
                break

    # Subcommands that other issues are adding while this packaging is written. Until they exist in
    # the sources their flags cannot be checked; the summary says so. Anything else must exist.
    PENDING_COMMANDS = {"feedback": "the feedback worker", "demo": "the demo"}

    def check_invocation(self, argv: list[str], where: Path, what: str, notes: set):
        """Checks `apns-fleet <subcommand> --flag value ...` against the command's declared flags."""
        if not argv:
            self.problem(where, f"{what}: no subcommand given to apns-fleet")
            return None
        sub = argv[0]
        command = self.commands.get(sub)
        if command is None:
            if sub in self.PENDING_COMMANDS:
                notes.add(f"`apns-fleet {sub}` ({self.PENDING_COMMANDS[sub]}) is not in the sources yet: {rel(where, self.root)} uses it, its flags were not checked")
                return sub
            close = difflib.get_close_matches(sub, list(self.commands), n=1)
            self.problem(where, f"{what}: `apns-fleet {sub}` is no subcommand" + (f" (did you mean {close[0]}?)" if close else "")
                         + f"; known: {', '.join(sorted(self.commands))}")
            return None
        if not command["registered"]:
            self.problem(where, f"{what}: `apns-fleet {sub}` ({command['struct']}) is not registered in APNsFleet.swift")
        for arg in argv[1:]:
            if arg.startswith("-") and not re.fullmatch(r"-\d+", arg):
                flag = arg.split("=", 1)[0]
                if flag not in command["flags"]:
                    close = difflib.get_close_matches(flag, sorted(command["flags"]), n=1)
                    self.problem(where, f"{what}: `apns-fleet {sub}` has no flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
        return sub

    def _feedback_rules(self):
        # `apns-fleet feedback` refuses token-auth apps whose legacy feedback service is over TLS.
        text = "".join(read(p) for p in (self.root / "Sources/apns-fleet").rglob("Feedback*.swift"))
        self.feedback_needs_certificates = "over TLS needs certificate auth" in text

    def _simulator_ports(self):
        path = self.root / "Sources/apns-fleet/Commands/SimulatorCommand.swift"
        text = read(path)
        self.simulator_ports = {int(p) for p in re.findall(r"configuration\.listeners\.\w+Port = (\d+)", text)}
        if not self.simulator_ports:
            self.problem(path, "cannot read the simulator's default ports (configuration.listeners.<x>Port = N)")

    def _stop_budget(self):
        # The longest a worker process takes to stop after SIGTERM: drain + graceful-shutdown
        # margin + cancellation (swift-service-lifecycle settings of the worker processes).
        self.stop_extra = 0
        for path in sorted((self.root / "Sources/apns-fleet").rglob("*.swift")):
            text = read(path)
            # Assigned directly, or through the local constant the stop's watchdog shares.
            graceful = re.search(r"(?:maximumGracefulShutdownDuration|gracefulBudget)\s*=.*drainTimeoutSeconds.*\+\s*\.seconds\((\d+)\)", text)
            cancel = re.search(r"maximumCancellationDuration\s*=\s*\.seconds\((\d+)\)", text)
            if graceful and cancel:
                self.stop_extra = max(self.stop_extra, int(graceful.group(1)) + int(cancel.group(1)))
        if not self.stop_extra:
            self.problem(self.root / "Sources/apns-fleet", "cannot read the worker's shutdown budget "
                         "(maximumGracefulShutdownDuration = drain + .seconds(N), maximumCancellationDuration = .seconds(M))")
            self.stop_extra = 20

    # Metrics -----------------------------------------------------------------------------

    # Modules linked into the worker processes; the simulator and test support export nothing.
    METRIC_MODULES_EXCLUDED = {"APNsSimulator", "FleetTestSupport"}

    def _metrics(self):
        self.metrics: dict[str, str] = {}  # exported name -> counter | gauge | histogram
        kinds = {"Counter": "counter", "FloatingPointCounter": "counter", "Gauge": "gauge",
                 "Meter": "gauge", "Recorder": "histogram", "Timer": "histogram"}
        call = re.compile(r"\b(?:Metrics\.|CoreMetrics\.)?(Counter|FloatingPointCounter|Gauge|Meter|Recorder|Timer)\(\s*label:\s*"
                          r'(?:"([^"]+)"|(\w+))')
        pair = re.compile(r'\(\s*"[A-Za-z_]+"\s*,\s*"((?:apns|kafka)\.[A-Za-z0-9_.]+)"\s*\)')
        for path in sorted((self.root / "Sources").rglob("*.swift")):
            module = path.relative_to(self.root / "Sources").parts[0]
            if module in self.METRIC_MODULES_EXCLUDED:
                continue
            text = read(path)
            for kind, literal, variable in call.findall(text):
                if literal:
                    self.metrics[prometheus_name(literal)] = kinds[kind]
                else:
                    # A label passed in a variable: the (field, "label") pairs of that file feed it.
                    for label in pair.findall(text):
                        self.metrics[prometheus_name(label)] = kinds[kind]
        if not self.metrics:
            self.problem(self.root / "Sources", "found no swift-metrics label in the worker's modules")

    def series_names(self) -> dict[str, str]:
        """Every series name a scrape can show, mapped to the metric it belongs to."""
        names = {}
        for name, kind in self.metrics.items():
            names[name] = name
            if kind == "histogram":
                for suffix in ("_bucket", "_sum", "_count"):
                    names[name + suffix] = name
        return names


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def kebab(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", name).lower()


def balanced(text: str, start: int) -> str:
    """The parenthesised text starting at text[start] == '(' (string literals respected)."""
    depth, i, in_string = 0, start, False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1
    return text[start:]


def prometheus_name(label: str) -> str:
    """swift-prometheus's fix for invalid names: each invalid character becomes '_'."""
    out = []
    for i, c in enumerate(label):
        ok = c.isascii() and (c.isalpha() or c == "_" or c == ":" or (c.isdigit() and i > 0))
        out.append(c if ok else "_")
    return "".join(out)


def flatten(value, prefix="") -> dict:
    """Nested mapping -> {"a.b.c": leaf}; lists are leaves."""
    out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out


def load_yaml_documents(path: Path, problem) -> list:
    try:
        with open(path, encoding="utf-8") as handle:
            return [d for d in yaml.safe_load_all(handle) if d is not None]
    except yaml.YAMLError as error:
        problem(path, f"is not valid YAML: {error}".replace("\n", " "))
    except OSError as error:
        problem(path, f"cannot be read: {error}")
    return []


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def host_port(text: str) -> tuple[str, int] | None:
    match = re.fullmatch(r"\[?([^\]]+?)\]?:(\d+)", text.strip())
    return (match.group(1), int(match.group(2))) if match else None


# ---------------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------------


class Checker:
    def __init__(self, root: Path, externals: bool = True):
        self.root = root.resolve()
        self.externals = externals
        self.problems: list[str] = []
        self.notes: set[str] = set()
        self.counts: dict[str, int] = {}
        self.facts = SourceFacts(self.root, self.problem)

    def problem(self, path: Path, message: str):
        self.problems.append(f"{rel(path, self.root)}: {message}")

    def count(self, what: str, n: int = 1):
        self.counts[what] = self.counts.get(what, 0) + n

    def run(self):
        self.yaml_files = sorted(p for d in ("docker", "deploy") for p in (self.root / d).rglob("*")
                                 if p.suffix in (".yaml", ".yml") and p.is_file())
        self.documents = {p: load_yaml_documents(p, self.problem) for p in self.yaml_files}
        self.count("YAML files parsed", len(self.yaml_files))
        self.check_dockerfile()
        self.check_compose()
        self.check_kubernetes()
        self.check_dashboard()
        return self

    # Configuration files -----------------------------------------------------------------

    def check_config(self, path: Path, config, env: dict | None = None, where: str = "", env_path: Path | None = None) -> dict:
        """Checks one fleet configuration (file contents at `path` + environment set in
        `env_path`); returns the effective flat configuration with defaults filled in (app keys
        only as given)."""
        what = where or rel(path, self.root)
        env_path = env_path or path
        facts = self.facts
        if not isinstance(config, dict):
            self.problem(path, f"{what}: a fleet configuration must be a mapping")
            return {}
        flat = flatten(config)
        apps = [str(a) for a in as_list(flat.get("apps"))]
        file_apps = set(apps)  # app.<name>.* keys of these are real, even if the environment lists fewer apps
        env = env or {}
        if facts.env_name("apps") in env:
            apps = [a.strip() for a in str(env[facts.env_name("apps")]).split(",") if a.strip()]
        effective = {k: v["default"] for k, v in facts.keys.items() if not k.startswith("app.")}
        given = set()
        for key, value in flat.items():
            self.count("configuration keys checked")
            parts = key.split(".")
            if parts[0] == "app":
                if len(parts) < 3:
                    self.problem(path, f"{what}: key '{key}' must be app.<name>.<setting>")
                    continue
                app, suffix = parts[1], ".".join(parts[2:])
                if suffix not in facts.app_suffixes:
                    close = difflib.get_close_matches(suffix, sorted(facts.app_suffixes), n=1)
                    self.problem(path, f"{what}: key '{key}' is no configuration key" + (f" (did you mean app.{app}.{close[0]}?)" if close else ""))
                    continue
                if app not in apps and app not in file_apps:
                    self.problem(path, f"{what}: key '{key}' configures app '{app}', which is not in apps ({', '.join(apps) or 'none'})")
                if app not in apps:
                    continue  # configured in the file, not used by this process
                template = f"app.<name>.{suffix}"
            else:
                if key not in facts.plain_keys:
                    close = difflib.get_close_matches(key, sorted(facts.plain_keys), n=1)
                    self.problem(path, f"{what}: key '{key}' is no configuration key" + (f" (did you mean {close[0]}?)" if close else ""))
                    continue
                template = key
            self.check_value(path, what, key, template, value)
            effective[key] = value
            given.add(key)
        for name, value in env.items():
            if not name.startswith(facts.env_prefix):
                continue
            self.count("APNS_FLEET_ variables checked")
            key, trouble = facts.key_for_env(name, apps)
            if trouble:
                self.problem(env_path, f"{what}: environment variable {name} {trouble}")
                continue
            template = key if not key.startswith("app.") else "app.<name>." + key.split(".", 2)[2]
            self.check_value(env_path, what, key, template, value)
            effective[key] = value
            given.add(key)
        for app in apps:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", app):
                self.problem(path, f"{what}: app name '{app}' may only use letters, digits, - and _")
            auth = str(effective.get(f"app.{app}.auth", "token"))
            if auth == "token":
                for suffix in ("key-file", "key-id", "team-id"):
                    if f"app.{app}.{suffix}" not in effective:
                        self.problem(path, f"{what}: app '{app}' uses token auth but sets no app.{app}.{suffix}")
            elif auth == "certificate":
                if f"app.{app}.pkcs12-file" not in effective and not (
                        f"app.{app}.certificate-file" in effective and f"app.{app}.private-key-file" in effective):
                    self.problem(path, f"{what}: app '{app}' uses certificate auth but sets neither certificate-file + private-key-file nor pkcs12-file")
            if str(effective.get(f"app.{app}.environment", "production")) == "custom" and f"app.{app}.host" not in effective:
                self.problem(path, f"{what}: app '{app}' has environment custom but no app.{app}.host")
        default_app = effective.get("default-app")
        if default_app not in (None, "(the only app)") and str(default_app) not in apps:
            self.problem(path, f"{what}: default-app '{default_app}' is not in apps")
        effective["apps"] = apps
        effective["_given"] = given
        return effective

    def check_value(self, path, what, key, template, value):
        facts = self.facts
        type_ = facts.keys[template]["type"]
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        if isinstance(value, bool):
            text = "true" if value else "false"
        choices = facts.choices(template)
        if choices and text not in choices:
            self.problem(path, f"{what}: {key} is '{text}'; expected one of {', '.join(choices)}")
        if type_ in ("integer", "1-64") and not re.fullmatch(r"-?\d+", text):
            self.problem(path, f"{what}: {key} must be an integer, got '{text}'")
        if type_ == "number" and not re.fullmatch(r"-?\d+(\.\d+)?", text):
            self.problem(path, f"{what}: {key} must be a number, got '{text}'")
        if type_ == "10 characters" and not re.fullmatch(r"[A-Za-z0-9]{10}", text):
            self.problem(path, f"{what}: {key} must be 10 letters or digits, got '{text}'")
        if type_ == "bool" and text.lower() not in ("true", "false", "yes", "no", "1", "0", "on", "off"):
            self.problem(path, f"{what}: {key} must be true or false, got '{text}'")
        if "Secret" in facts.keys[template].get("type", "") or template.endswith("password"):
            self.problem(path, f"{what}: {key} holds a secret value in plain configuration; use a *-file key or an environment variable from a secret store")

    def check_feedback_apps(self, path: Path, where: str, effective: dict):
        """The feedback worker polls each app's legacy feedback service; over TLS that needs
        certificate auth, and the command refuses to start otherwise."""
        if not self.facts.feedback_needs_certificates:
            return
        for app in effective.get("apps", []):
            auth = str(effective.get(f"app.{app}.auth", "token"))
            # Legacy endpoints have no default (Apple closed its own in 2021): only an app that
            # sets legacy-feedback has one.
            has_endpoint = f"app.{app}.legacy-feedback" in effective
            tls = str(effective.get(f"app.{app}.legacy-tls", "true")).lower() in ("true", "yes", "1", "on")
            if auth == "token" and has_endpoint and tls:
                self.problem(path, f"{where}: app {app} uses token auth, and its legacy feedback service is over TLS "
                                   f"(app.{app}.legacy-feedback), "
                                   "so `apns-fleet feedback` refuses to start; drop that key or use certificate auth")

    def load_with_binary(self, path: Path, content: str):
        """Loads a fleet config with the real loader (apns-fleet validate-job --config)."""
        binary = self.root / ".build/debug/apns-fleet"
        if not self.externals or not binary.exists():
            return
        with tempfile.TemporaryDirectory() as tmp:
            config = yaml.safe_load(content)
            # The loader reads kafka.sasl.password-file at start; point it at a stand-in.
            sasl = config.get("kafka", {}).get("sasl", {}) if isinstance(config.get("kafka"), dict) else {}
            if isinstance(sasl, dict) and "password-file" in sasl:
                stand_in = Path(tmp) / "password"
                stand_in.write_text("stand-in\n")
                stand_in.chmod(0o600)
                sasl["password-file"] = str(stand_in)
            copy_path = Path(tmp) / "fleet.yaml"
            copy_path.write_text(yaml.safe_dump(config))
            job = json.dumps({"token": "ab" * 32, "payload": {"aps": {"alert": "check"}}})
            try:
                run = subprocess.run([str(binary), "validate-job", "--config", str(copy_path), "--quiet"],
                                     input=job, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as error:
                self.notes.add(f"could not run {binary.name} validate-job: {error}")
                return
            if run.returncode == 2 or "configuration" in run.stderr:
                self.problem(path, f"the real configuration loader rejects it: {run.stderr.strip() or run.stdout.strip()}")
            elif run.returncode in (0, 1):
                self.count("configs loaded by the real loader")
            else:
                self.notes.add(f"{binary} validate-job exited {run.returncode}; configs were not loaded by the real loader")

    # Dockerfile ----------------------------------------------------------------------------

    def check_dockerfile(self):
        path = self.root / "docker/Dockerfile"
        text = read(path)
        if not text:
            self.problem(path, "is missing")
            self.stages = {}
            return
        lines, current = [], ""
        for raw in text.splitlines():
            if raw.strip().startswith("#") and not current:
                continue
            if raw.rstrip().endswith("\\"):
                current += raw.rstrip()[:-1] + " "
                continue
            current += raw
            if current.strip():
                lines.append(current.strip())
            current = ""
        args, stages, order, stage = {}, {}, [], None
        for line in lines:
            instruction, _, rest = line.partition(" ")
            instruction = instruction.upper()
            if instruction == "ARG" and stage is None:
                name, _, default = rest.partition("=")
                args[name.strip()] = default.strip()
            elif instruction == "FROM":
                match = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
                base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), match.group(1))
                name = match.group(2) or f"stage{len(order)}"
                parent = stages.get(base)
                stage = {"name": name, "base": base, "user": parent["user"] if parent else None,
                         "healthcheck": parent["healthcheck"] if parent else None,
                         "entrypoint": parent["entrypoint"] if parent else None,
                         "runs": [], "copies": list(parent["copies"]) if parent else [],
                         "env": dict(parent["env"]) if parent else {},
                         "root_image": parent["root_image"] if parent else base}
                stages[name] = stage
                order.append(name)
            elif stage is not None:
                if instruction == "USER":
                    stage["user"] = rest.strip()
                elif instruction == "HEALTHCHECK":
                    stage["healthcheck"] = rest.strip()
                elif instruction == "ENTRYPOINT":
                    stage["entrypoint"] = rest.strip()
                elif instruction == "RUN":
                    stage["runs"].append(rest)
                elif instruction == "COPY":
                    stage["copies"].append(rest)
                elif instruction == "ENV":
                    for pair in shlex.split(rest):
                        name, _, value = pair.partition("=")
                        stage["env"][name] = value
        self.stages = stages
        # What the image's ENV sets; a container's own env wins over it (Kubernetes, compose).
        self.image_env = dict(stages[order[-1]]["env"]) if order else {}
        self.dockerfile_entrypoint = None
        if not order:
            self.problem(path, "has no FROM")
            return
        build = [s for s in stages.values() if re.match(r"(swift|.*/swift):6", s["root_image"])]
        if not build:
            self.problem(path, "no stage builds on a Swift 6 image (FROM swift:6.x-...)")
        else:
            runs = " ".join(build[0]["runs"])
            for package in ("librdkafka-dev", "libnghttp2-dev", "libjemalloc-dev", "libssl-dev", "pkg-config"):
                if package not in runs:
                    self.problem(path, f"build stage '{build[0]['name']}' does not install {package}")
            if not re.search(r"swift build -c release --product apns-fleet\b.*--static-swift-stdlib", runs):
                self.problem(path, f"build stage '{build[0]['name']}' does not run swift build -c release --product apns-fleet --static-swift-stdlib")
        final = stages[order[-1]]
        self.final_stage = final
        if not re.match(r"debian:\S*slim", final["root_image"]):
            self.problem(path, f"the final stage '{final['name']}' is not based on a debian slim image ({final['root_image']})")
        runtime_runs = " ".join(r for s in stages.values() if s["root_image"] == final["root_image"] for r in s["runs"])
        for package in ("librdkafka1", "libnghttp2-14", "libjemalloc2", "ca-certificates"):
            if package not in runtime_runs:
                self.problem(path, f"the runtime stages do not install {package}")
        user = (final["user"] or "root").split(":")[0]
        if user in ("root", "0"):
            self.problem(path, f"the final stage '{final['name']}' runs as root (add USER with a non-root user)")
        if not final["healthcheck"] or "NONE" in final["healthcheck"].upper().split():
            self.problem(path, f"the final stage '{final['name']}' has no HEALTHCHECK")
        else:
            command = re.search(r"CMD\s+(.*)", final["healthcheck"])
            tool = None
            if command:
                try:
                    tool = json.loads(command.group(1))[0]
                except (ValueError, IndexError):
                    tool = command.group(1).split()[0]
            copied = [c.split()[-1] for c in final["copies"]]
            if tool and tool.startswith("/usr/local/bin/") and tool not in copied:
                self.problem(path, f"HEALTHCHECK runs {tool}, which no COPY puts into the image")
            if "/healthz" not in final["healthcheck"]:
                self.problem(path, "HEALTHCHECK does not check /healthz")
        if not final["entrypoint"] or "apns-fleet" not in final["entrypoint"]:
            self.problem(path, "the final stage's ENTRYPOINT is not apns-fleet")
        self.dockerfile_entrypoint = final["entrypoint"]
        # COPY sources exist in the context (the repository root) and survive .dockerignore.
        ignore = [l.strip() for l in read(self.root / ".dockerignore").splitlines() if l.strip() and not l.startswith("#")]
        if not ignore:
            self.problem(self.root / ".dockerignore", "is missing or empty")
        for needed in (".build", ".git", "dev-credentials"):
            if needed not in ignore:
                self.problem(self.root / ".dockerignore", f"does not exclude {needed}")
        for stage in stages.values():
            for copy_args in stage["copies"]:
                if "--from=" in copy_args:
                    continue
                for source in copy_args.split()[:-1]:
                    if source.startswith("--"):
                        continue
                    matches = list(self.root.glob(source.replace("[d]", "d") if "[" in source else source))
                    if not matches and "[" not in source:
                        self.problem(path, f"COPY {source}: no such file in the build context")
                    elif matches and dockerignored(source, ignore):
                        self.problem(path, f"COPY {source}: excluded by .dockerignore")
        self.count("Dockerfile stages", len(order))

    # Compose ----------------------------------------------------------------------------

    def check_compose(self):
        path = self.root / "docker/compose.yaml"
        docs = self.documents.get(path)
        if not docs:
            self.problem(path, "is missing or empty")
            return
        compose = docs[0]
        base = path.parent
        services = compose.get("services") or {}
        volumes = compose.get("volumes") or {}
        for key in compose:
            if key not in ("name", "services", "volumes", "networks", "configs", "secrets") and not str(key).startswith("x-"):
                self.problem(path, f"unknown top-level key '{key}'")
        built_images, used_volumes, host_ports = {}, set(), {}
        for name, service in services.items():
            build = service.get("build")
            if build:
                build = {"context": build} if isinstance(build, str) else build
                context = (base / build.get("context", ".")).resolve()
                dockerfile = context / build.get("dockerfile", "Dockerfile")
                if not context.is_dir():
                    self.problem(path, f"service {name}: build context {build.get('context')} does not exist")
                if not dockerfile.is_file():
                    self.problem(path, f"service {name}: Dockerfile {build.get('dockerfile')} does not exist")
                target = build.get("target")
                if dockerfile == self.root / "docker/Dockerfile" and target and target not in self.stages:
                    self.problem(path, f"service {name}: build target '{target}' is no stage of docker/Dockerfile ({', '.join(self.stages)})")
                if service.get("image"):
                    built_images[service["image"]] = target or "(last stage)"
        ours = {}
        for name, service in services.items():
            image = service.get("image")
            if not image and not service.get("build"):
                self.problem(path, f"service {name}: has neither image nor build")
                continue
            if image and not service.get("build"):
                if image.split(":")[0] in {i.split(":")[0] for i in built_images} and image not in built_images:
                    self.problem(path, f"service {name}: image {image} is built by no service (built: {', '.join(built_images)})")
                elif image not in built_images and (":" not in image or image.endswith(":latest")):
                    self.problem(path, f"service {name}: image {image} must be pinned to a tag other than latest")
            ours[name] = image in built_images or bool(service.get("build"))
        self.compose_services = services
        for name, service in services.items():
            self.count("compose services checked")
            where = f"service {name}"
            # Scalable services (deploy.replicas or the workers) must not pin names or host ports.
            scalable = (service.get("deploy") or {}).get("replicas", 1) != 1 or name == "worker"
            if scalable and service.get("container_name"):
                self.problem(path, f"{where}: container_name prevents --scale")
            # depends_on
            depends = service.get("depends_on") or {}
            if isinstance(depends, list):
                depends = {d: {"condition": "service_started"} for d in depends}
            for dependency, spec in depends.items():
                target = services.get(dependency)
                if target is None:
                    self.problem(path, f"{where}: depends_on {dependency}, which is no service")
                    continue
                condition = (spec or {}).get("condition", "service_started")
                if condition == "service_completed_successfully" and target.get("restart", "no") not in ("no", "on-failure"):
                    self.problem(path, f"{where}: waits for {dependency} to complete, but {dependency} restarts ({target.get('restart')})")
                if condition == "service_healthy":
                    health = target.get("healthcheck") or {}
                    if health.get("disable") or (not health and not ours.get(dependency)):
                        self.problem(path, f"{where}: waits for {dependency} to be healthy, but {dependency} has no healthcheck")
            # volumes
            mounts = {}
            for volume in as_list(service.get("volumes")):
                if isinstance(volume, dict):
                    source, target = volume.get("source"), volume.get("target")
                else:
                    parts = str(volume).split(":")
                    source, target = (parts[0], parts[1]) if len(parts) > 1 else (None, parts[0])
                if source is None:
                    continue
                if source.startswith((".", "/")):
                    host = (base / source).resolve()
                    if not host.exists():
                        self.problem(path, f"{where}: volume source {source} does not exist")
                    mounts[target] = host
                else:
                    if source not in volumes:
                        self.problem(path, f"{where}: named volume {source} is not declared under volumes")
                    used_volumes.add(source)
                    mounts[target] = source
            service["_mounts"] = mounts
            # ports
            for port in as_list(service.get("ports")):
                text = str(port["published"]) + ":" + str(port["target"]) if isinstance(port, dict) else str(port)
                bits = text.split("/")[0].split(":")
                if scalable and len(bits) > 1:
                    self.problem(path, f"{where}: publishes host port {bits[-2]}, which collides when scaled (use expose)")
                if len(bits) > 1:
                    if bits[-2] in host_ports:
                        self.problem(path, f"{where}: host port {bits[-2]} is also published by {host_ports[bits[-2]]}")
                    host_ports[bits[-2]] = name
        for volume in volumes:
            if volume not in used_volumes:
                self.problem(path, f"volume {volume} is declared but no service mounts it")

        # The apns-fleet services: commands, configuration, ports.
        self.compose_config = {}
        for name, service in services.items():
            if not ours.get(name):
                continue
            where = f"service {name}"
            invocations = []
            entrypoint = as_list(service.get("entrypoint"))
            command = service.get("command")
            if entrypoint and entrypoint[0] in ("/bin/sh", "/bin/bash", "sh", "bash"):
                script = command[0] if isinstance(command, list) else str(command)
                for line in script.replace("\\\n", " ").splitlines():
                    try:
                        words = shlex.split(line, comments=True)
                    except ValueError:
                        continue
                    for i, word in enumerate(words):
                        if word == "apns-fleet" or word.endswith("/apns-fleet"):
                            invocations.append(words[i + 1:])
            elif not entrypoint:
                argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in as_list(command)]
                invocations.append(argv)
            else:
                self.problem(path, f"{where}: overrides the entrypoint with {entrypoint[0]}; use the image's apns-fleet entrypoint or a shell")
            env = service.get("environment") or {}
            if isinstance(env, list):
                env = dict(e.split("=", 1) if "=" in e else (e, "") for e in env)
            env = {str(k): "" if v is None else str(v) for k, v in env.items()}
            subs = []
            for argv in invocations:
                argv = [a for a in argv]
                sub = self.facts.check_invocation(argv, path, where, self.notes)
                subs.append(sub)
                self.count("apns-fleet invocations checked")
                if sub in ("worker", "feedback"):
                    config_path = option_value(argv, "--config")
                    config, config_file = {}, None
                    if config_path:
                        config_file = service["_mounts"].get(config_path)
                        if not isinstance(config_file, Path):
                            self.problem(path, f"{where}: --config {config_path} is not a file mounted into the service")
                        else:
                            docs = self.documents.get(config_file) or load_yaml_documents(config_file, self.problem)
                            config = docs[0] if docs else {}
                            if config_file not in self.checked_configs():
                                self.checked_configs().add(config_file)
                                self.load_with_binary(config_file, read(config_file))
                    effective = self.check_config(config_file or path, config, env, where=f"{where} (config + environment)", env_path=path)
                    self.compose_config[name] = effective
                    self.check_compose_worker(path, name, service, effective, sub)
                    if sub == "feedback":
                        self.check_feedback_apps(path, where, effective)
            if any(sub == "simulator" for sub in subs):
                self.simulator_service = name
        self.check_compose_consistency(path, services)
        self.check_prometheus(services)

    def checked_configs(self) -> set:
        if not hasattr(self, "_checked_configs"):
            self._checked_configs = set()
        return self._checked_configs

    def check_compose_worker(self, path, name, service, effective, sub):
        where = f"service {name}"
        port = str(effective.get("admin.port"))
        exposed = {str(p).split("/")[0] for p in as_list(service.get("expose"))}
        if port not in exposed:
            self.problem(path, f"{where}: admin.port is {port} but the service exposes {', '.join(sorted(exposed)) or 'nothing'}")
        if str(effective.get("admin.host")) in ("127.0.0.1", "localhost"):
            self.problem(path, f"{where}: admin.host is {effective.get('admin.host')}: /metrics and /healthz are unreachable from other containers (use 0.0.0.0)")
        health = service.get("healthcheck") or {}
        test = " ".join(map(str, as_list(health.get("test"))))
        if health and not health.get("disable") and "/healthz" not in test:
            self.problem(path, f"{where}: the healthcheck does not check /healthz")
        grace = service.get("stop_grace_period")
        drain = float(effective.get("worker.drain-timeout-seconds", 25))
        if grace is None or seconds(grace) < drain + self.facts.stop_extra:
            self.problem(path, f"{where}: stop_grace_period {grace or '10s (default)'} is shorter than the worker's longest stop, "
                               f"worker.drain-timeout-seconds ({drain:g}) + {self.facts.stop_extra} s")
        # Files the config names must be in a mounted volume.
        for key in sorted(effective["_given"]):
            value = effective[key]
            if key.endswith("-file"):
                if not any(str(value).startswith(str(target).rstrip("/") + "/") for target in service["_mounts"]):
                    self.problem(path, f"{where}: {key} is {value}, which is in no volume mounted into the service")
        # Kafka bootstrap and APNs hosts are services of this compose file.
        for server in str(effective.get("kafka.bootstrap-servers", "")).split(","):
            hp = host_port(server)
            if hp and hp[0] not in self.compose_services_names():
                self.problem(path, f"{where}: kafka.bootstrap-servers names {server}, and {hp[0]} is no service here")
            elif hp and not self.kafka_listens(hp):
                self.problem(path, f"{where}: kafka.bootstrap-servers names {server}, but {hp[0]} has no listener on port {hp[1]}")
        for app in effective["apps"]:
            if str(effective.get(f"app.{app}.environment")) == "custom":
                host = str(effective.get(f"app.{app}.host"))
                port_ = int(effective.get(f"app.{app}.port", 443))
                if host not in self.compose_services_names():
                    self.problem(path, f"{where}: app.{app}.host is {host}, which is no service here")
                elif port_ not in self.facts.simulator_ports:
                    self.problem(path, f"{where}: app.{app}.port is {port_}; the simulator listens on {sorted(self.facts.simulator_ports)}")
            feedback = effective.get(f"app.{app}.legacy-feedback")
            if feedback:
                hp = host_port(str(feedback))
                if hp and hp[0] in self.compose_services_names() and hp[1] not in self.facts.simulator_ports:
                    self.problem(path, f"{where}: app.{app}.legacy-feedback port {hp[1]} is none of the simulator's ports")

    def compose_services_names(self):
        return set(self.compose_services)

    def kafka_listens(self, hp) -> bool:
        service = self.compose_services.get(hp[0]) or {}
        env = service.get("environment") or {}
        listeners = str(env.get("KAFKA_LISTENERS", "")) if isinstance(env, dict) else ""
        if not listeners:
            return True  # not a broker we can read; accept
        return any(l.rsplit(":", 1)[-1] == str(hp[1]) for l in listeners.split(","))

    def check_compose_consistency(self, path, services):
        # Topics the workers use are created by the one-shot topic service.
        created, compacted = set(), set()
        for name, service in services.items():
            script = " ".join(map(str, as_list(service.get("command"))))
            if "kafka-topics" in script:
                for line in script.splitlines():
                    topic = re.search(r"--topic\s+(\S+)", line)
                    if topic and "--create" in line or (topic and line.strip().startswith("create ")):
                        created.add(topic.group(1))
                        if "cleanup.policy=compact" in line:
                            compacted.add(topic.group(1))
        for name, effective in self.compose_config.items():
            for key in ("topics.jobs", "topics.retry", "topics.dlq", "topics.results", "topics.token-events"):
                topic = str(effective.get(key))
                if topic not in created:
                    self.problem(path, f"service {name}: {key} is {topic}, which no service creates")
            events = str(effective.get("topics.token-events"))
            if events in created and events not in compacted:
                self.problem(path, f"topic {events} (topics.token-events) must be created with cleanup.policy=compact")
        # The dev credentials written are the ones the configuration names.
        for name, service in services.items():
            script = " ".join(map(str, as_list(service.get("command"))))
            if "dev-credentials" not in script:
                continue
            key_id = re.search(r"--key-id\s+(\S+)", script)
            team_id = re.search(r"--team-id\s+(\S+)", script)
            for worker, effective in self.compose_config.items():
                for app in effective["apps"]:
                    if str(effective.get(f"app.{app}.auth", "token")) != "token":
                        continue
                    if key_id and str(effective.get(f"app.{app}.key-id")) != key_id.group(1):
                        self.problem(path, f"service {worker}: app.{app}.key-id is {effective.get(f'app.{app}.key-id')}, "
                                           f"but service {name} makes key {key_id.group(1)}")
                    if team_id and str(effective.get(f"app.{app}.team-id")) != team_id.group(1):
                        self.problem(path, f"service {worker}: app.{app}.team-id differs from the --team-id of service {name}")
                    if key_id and not str(effective.get(f"app.{app}.key-file", "")).endswith(f"AuthKey_{key_id.group(1)}.p8"):
                        self.problem(path, f"service {worker}: app.{app}.key-file should be AuthKey_{key_id.group(1)}.p8 as written by dev-credentials")

    def check_prometheus(self, services):
        path = self.root / "docker/prometheus.yml"
        docs = self.documents.get(path)
        if not docs:
            self.problem(path, "is missing or empty")
            return
        scraped = set()
        for job in docs[0].get("scrape_configs") or []:
            targets = []
            for sd in job.get("dns_sd_configs") or []:
                targets += [(n, sd.get("port")) for n in sd.get("names") or []]
            for static in job.get("static_configs") or []:
                targets += [host_port(t) or (t, None) for t in static.get("targets") or []]
            for host, port in targets:
                if host == "localhost":
                    continue
                if host not in services:
                    self.problem(path, f"job {job.get('job_name')}: target {host} is no compose service")
                    continue
                scraped.add(host)
                effective = self.compose_config.get(host)
                if effective and str(port) != str(effective.get("admin.port")):
                    self.problem(path, f"job {job.get('job_name')}: scrapes {host} on port {port}, but its admin.port is {effective.get('admin.port')}")
                if job.get("metrics_path", "/metrics") != "/metrics":
                    self.problem(path, f"job {job.get('job_name')}: metrics_path must be /metrics")
        for name in self.compose_config:
            if name not in scraped:
                self.problem(path, f"compose service {name} serves /metrics but no scrape job reaches it")

    # Kubernetes -------------------------------------------------------------------------

    def check_kubernetes(self):
        deploy = self.root / "deploy"
        kustomizations = sorted(deploy.rglob("kustomization.yaml"))
        if not kustomizations:
            self.problem(deploy, "has no kustomization.yaml")
            return
        self.k8s = {}          # (kind, name) -> (path, object)
        self.generated = {}    # ConfigMap name -> {key: (path, text)}
        listed_files = set()
        for kpath in kustomizations:
            docs = self.documents.get(kpath) or []
            if not docs:
                continue
            kust = docs[0]
            self.count("kustomizations checked")
            directory = kpath.parent
            for resource in as_list(kust.get("resources")):
                target = (directory / resource).resolve()
                if not target.exists():
                    self.problem(kpath, f"resources: {resource} does not exist")
                elif target.is_dir() and not (target / "kustomization.yaml").exists():
                    self.problem(kpath, f"resources: {resource} is a directory without kustomization.yaml")
                listed_files.add(target)
            for generator in as_list(kust.get("configMapGenerator")) + as_list(kust.get("secretGenerator")):
                for entry in as_list(generator.get("files")):
                    key, _, source = str(entry).rpartition("=")
                    source_path = (directory / source).resolve()
                    if not source_path.is_file():
                        self.problem(kpath, f"generator {generator.get('name')}: file {source} does not exist")
                        continue
                    listed_files.add(source_path)
                    self.generated.setdefault(generator.get("name"), {})[key or source_path.name] = (source_path, read(source_path))
            for patch in as_list(kust.get("patches")) + as_list(kust.get("patchesStrategicMerge")):
                patch_path = (directory / (patch.get("path") if isinstance(patch, dict) else patch)).resolve()
                if not patch_path.is_file():
                    self.problem(kpath, f"patches: {patch_path.name} does not exist")
                listed_files.add(patch_path)
                self.pending_patch_targets = getattr(self, "pending_patch_targets", []) + [(kpath, patch, patch_path)]
            for file in directory.glob("*.y*ml"):
                if file.name != "kustomization.yaml" and file.resolve() not in listed_files:
                    self.problem(kpath, f"does not list {file.name} (in resources, a generator or patches)")
        for path, docs in self.documents.items():
            if "deploy" not in path.relative_to(self.root).parts[:1] or path.name == "kustomization.yaml":
                continue
            for doc in docs:
                if isinstance(doc, dict) and doc.get("kind") and doc.get("metadata", {}).get("name"):
                    if path.resolve() in listed_files or "secrets" in path.parts:
                        self.k8s.setdefault((doc["kind"], doc["metadata"]["name"]), (path, doc))
                        self.count("Kubernetes objects checked")
        for kpath, patch, patch_path in getattr(self, "pending_patch_targets", []):
            target = patch.get("target", {}) if isinstance(patch, dict) else {}
            docs = self.documents.get(patch_path) or []
            kind = target.get("kind") or (docs[0].get("kind") if docs else None)
            name = target.get("name") or (docs[0].get("metadata", {}).get("name") if docs else None)
            if (kind, name) not in self.k8s:
                self.problem(kpath, f"patch {patch_path.name} targets {kind}/{name}, which no resource defines")
        self.check_secret_templates()
        deployments = {n: (p, o) for (k, n), (p, o) in self.k8s.items() if k == "Deployment"}
        if not deployments:
            self.problem(deploy, "defines no Deployment")
        self.worker_deployments = {}
        for name, (path, deployment) in deployments.items():
            self.check_deployment(path, name, deployment)
        self.check_selectors(deployments)
        self.check_scaled_objects(deployments)
        self.render_kustomizations(kustomizations)

    def check_secret_templates(self):
        for (kind, name), (path, secret) in self.k8s.items():
            if kind != "Secret":
                continue
            values = dict(secret.get("stringData") or {})
            values.update(secret.get("data") or {})
            for key, value in values.items():
                text = str(value)
                if re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----\s*\n[A-Za-z0-9+/=]{16,}", text) or (
                        key in (secret.get("data") or {}) and len(text) > 40):
                    self.problem(path, f"Secret {name}: key {key} looks like real secret material; templates hold placeholders only")

    def secret_keys(self, name: str) -> set | None:
        entry = self.k8s.get(("Secret", name))
        if not entry:
            return None
        secret = entry[1]
        return set((secret.get("stringData") or {}).keys()) | set((secret.get("data") or {}).keys())

    def configmap_keys(self, name: str) -> dict | None:
        if name in self.generated:
            return self.generated[name]
        entry = self.k8s.get(("ConfigMap", name))
        if not entry:
            return None
        return {k: (entry[0], v) for k, v in (entry[1].get("data") or {}).items()}

    def check_deployment(self, path, name, deployment):
        where = f"Deployment {name}"
        spec = deployment.get("spec") or {}
        template = spec.get("template") or {}
        pod = template.get("spec") or {}
        pod_labels = (template.get("metadata") or {}).get("labels") or {}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if not labels_match(selector, pod_labels):
            self.problem(path, f"{where}: spec.selector does not match the pod template's labels")
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        mounted = set()
        security = pod.get("securityContext") or {}
        if not security.get("runAsNonRoot") or security.get("runAsUser") == 0:
            self.problem(path, f"{where}: the pod securityContext must set runAsNonRoot: true and a non-zero runAsUser")
        for container in pod.get("containers") or []:
            cwhere = f"{where}, container {container.get('name')}"
            args = [str(a) for a in as_list(container.get("command"))[1:] + as_list(container.get("args"))] \
                if container.get("command") else [str(a) for a in as_list(container.get("args"))]
            sub = self.facts.check_invocation(args, path, cwhere, self.notes)
            csec = container.get("securityContext") or {}
            if csec.get("readOnlyRootFilesystem") is not True:
                self.problem(path, f"{cwhere}: securityContext.readOnlyRootFilesystem must be true")
            if csec.get("allowPrivilegeEscalation") is not False:
                self.problem(path, f"{cwhere}: securityContext.allowPrivilegeEscalation must be false")
            resources = container.get("resources") or {}
            for part in ("requests", "limits"):
                if not (resources.get(part) or {}).get("memory"):
                    self.problem(path, f"{cwhere}: resources.{part}.memory is not set")
            if memory(resources.get("limits", {}).get("memory")) < memory(resources.get("requests", {}).get("memory")):
                self.problem(path, f"{cwhere}: the memory limit is below the request")
            mounts = {}
            for mount in container.get("volumeMounts") or []:
                if mount.get("name") not in volumes:
                    self.problem(path, f"{cwhere}: volumeMount {mount.get('name')} names no volume of the pod")
                    continue
                mounted.add(mount.get("name"))
                mounts[mount.get("mountPath").rstrip("/")] = volumes[mount.get("name")]
            # The config file: --config must be a key of a mounted ConfigMap.
            config, config_path, config_source = {}, option_value(args, "--config"), path
            # The image's ENV applies unless the container sets the variable itself: it wins over
            # the config file, so a changed admin.port in fleet.yaml would be silently undone.
            env = dict(getattr(self, "image_env", {}))
            for variable in container.get("env") or []:
                env[variable.get("name")] = str(variable.get("value", ""))
                ref = (variable.get("valueFrom") or {})
                if "secretKeyRef" in ref:
                    keys = self.secret_keys(ref["secretKeyRef"].get("name"))
                    if keys is None or ref["secretKeyRef"].get("key") not in keys:
                        self.problem(path, f"{cwhere}: env {variable.get('name')} refers to {ref['secretKeyRef']}, which no Secret template has")
                if "configMapKeyRef" in ref:
                    keys = self.configmap_keys(ref["configMapKeyRef"].get("name"))
                    if keys is None or ref["configMapKeyRef"].get("key") not in keys:
                        self.problem(path, f"{cwhere}: env {variable.get('name')} refers to {ref['configMapKeyRef']}, which no ConfigMap has")
            if config_path:
                directory, _, file_name = config_path.rpartition("/")
                volume = mounts.get(directory)
                if not volume or "configMap" not in volume:
                    self.problem(path, f"{cwhere}: --config {config_path} is not in a mounted ConfigMap")
                else:
                    keys = self.configmap_keys(volume["configMap"].get("name"))
                    if keys is None:
                        self.problem(path, f"{cwhere}: volume {volume.get('name')} mounts ConfigMap {volume['configMap'].get('name')}, which does not exist")
                    elif file_name not in keys:
                        self.problem(path, f"{cwhere}: --config {config_path}: ConfigMap {volume['configMap'].get('name')} has no key {file_name}")
                    else:
                        source, text = keys[file_name]
                        config_source = source
                        try:
                            config = yaml.safe_load(text) or {}
                        except yaml.YAMLError as error:
                            self.problem(source, f"is not valid YAML: {error}")
                        if source not in self.checked_configs():
                            self.checked_configs().add(source)
                            self.load_with_binary(source, text)
            elif sub in ("worker", "feedback"):
                self.problem(path, f"{cwhere}: runs apns-fleet {sub} without --config")
            effective = self.check_config(config_source, config, env, where=f"{cwhere} (config + environment)", env_path=path) \
                if sub in ("worker", "feedback") else {}
            if sub == "worker":
                self.worker_deployments[name] = effective
            if sub == "feedback":
                self.check_feedback_apps(path, cwhere, effective)
            # Every file the config names must come from a mounted volume, and from a key of it.
            for key in sorted(effective.get("_given", ())):
                value = effective[key]
                if not key.endswith("-file"):
                    continue
                directory, _, file_name = str(value).rpartition("/")
                volume = mounts.get(directory)
                if volume is None:
                    self.problem(path, f"{cwhere}: {key} is {value}, which is in no mounted volume")
                    continue
                if "secret" in volume:
                    secret_name = volume["secret"].get("secretName")
                    keys = self.secret_keys(secret_name)
                    items = volume["secret"].get("items")
                    if keys is None:
                        self.problem(path, f"{cwhere}: volume {volume.get('name')} mounts Secret {secret_name}, which has no template in deploy/")
                        continue
                    files = {i.get("path"): i.get("key") for i in items} if items else {k: k for k in keys}
                    if file_name not in files:
                        self.problem(path, f"{cwhere}: {key} is {value}, but Secret {secret_name} mounted there has no file {file_name} (has: {', '.join(sorted(files))})")
                    self.count("secret file references checked")
            for volume in volumes.values():
                if "secret" in volume:
                    keys = self.secret_keys(volume["secret"].get("secretName"))
                    if keys is None:
                        self.problem(path, f"{where}: volume {volume.get('name')} mounts Secret {volume['secret'].get('secretName')}, which has no template in deploy/")
                        continue
                    for item in volume["secret"].get("items") or []:
                        if item.get("key") not in keys:
                            self.problem(path, f"{where}: volume {volume.get('name')}: Secret {volume['secret'].get('secretName')} has no key {item.get('key')}")
                    mode = volume["secret"].get("defaultMode", 0o644)
                    if mode & 0o004:
                        self.problem(path, f"{where}: volume {volume.get('name')}: defaultMode {oct(mode)} makes the secret files world-readable")
                if "configMap" in volume and self.configmap_keys(volume["configMap"].get("name")) is None:
                    self.problem(path, f"{where}: volume {volume.get('name')} mounts ConfigMap {volume['configMap'].get('name')}, which does not exist")
            # Probes and ports.
            ports = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
            admin_port = effective.get("admin.port") if effective else None
            if effective and str(effective.get("admin.host")) in ("127.0.0.1", "localhost"):
                self.problem(path, f"{cwhere}: admin.host is {effective.get('admin.host')}; probes and Prometheus cannot reach it (use 0.0.0.0)")
            expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
            for probe_name, expected_path in expected.items():
                probe = container.get(probe_name)
                if probe is None:
                    if probe_name != "startupProbe":
                        self.problem(path, f"{cwhere}: has no {probe_name}")
                    continue
                http = probe.get("httpGet") or {}
                if http.get("path") != expected_path:
                    self.problem(path, f"{cwhere}: {probe_name} checks {http.get('path')}, expected {expected_path}")
                port = http.get("port")
                number = ports.get(port) if isinstance(port, str) else port
                if isinstance(port, str) and port not in ports:
                    self.problem(path, f"{cwhere}: {probe_name} uses port '{port}', which the container does not declare")
                elif admin_port is not None and str(number) != str(admin_port):
                    self.problem(path, f"{cwhere}: {probe_name} uses port {number}, but admin.port is {admin_port}")
                self.count("probes checked")
            if admin_port is not None and str(admin_port) not in {str(v) for v in ports.values()}:
                self.problem(path, f"{cwhere}: admin.port {admin_port} is not a container port")
            if sub in ("worker", "feedback"):
                drain = float(effective.get("worker.drain-timeout-seconds", 25))
                grace = pod.get("terminationGracePeriodSeconds", 30)
                if grace < drain + self.facts.stop_extra:
                    self.problem(path, f"{where}: terminationGracePeriodSeconds {grace} is shorter than the worker's longest stop: "
                                       f"worker.drain-timeout-seconds ({drain:g}) + {self.facts.stop_extra} s of shutdown and cancellation")
        for volume in volumes:
            if volume not in mounted:
                self.problem(path, f"{where}: volume {volume} is mounted by no container")
        deployment["_pod_labels"] = pod_labels
        deployment["_ports"] = {p.get("name"): p.get("containerPort") for c in pod.get("containers") or [] for p in c.get("ports") or []}

    def check_selectors(self, deployments):
        services = {n: (p, o) for (k, n), (p, o) in self.k8s.items() if k == "Service"}
        for name, (path, service) in services.items():
            selector = (service.get("spec") or {}).get("selector") or {}
            selected = [d for d, (_, o) in deployments.items() if labels_match(selector, o["_pod_labels"])]
            if not selected:
                self.problem(path, f"Service {name}: selector {selector} matches no Deployment's pods")
            for port in (service.get("spec") or {}).get("ports") or []:
                target = port.get("targetPort", port.get("port"))
                for d in selected:
                    declared = deployments[d][1]["_ports"]
                    if isinstance(target, str) and target not in declared:
                        self.problem(path, f"Service {name}: targetPort '{target}' is no container port of Deployment {d}")
                    if isinstance(target, int) and target not in declared.values():
                        self.problem(path, f"Service {name}: targetPort {target} is no container port of Deployment {d}")
        for (kind, name), (path, monitor) in self.k8s.items():
            if kind == "ServiceMonitor":
                selector = ((monitor.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
                matched = [s for s, (_, o) in services.items() if labels_match(selector, (o.get("metadata") or {}).get("labels") or {})]
                if not matched:
                    self.problem(path, f"ServiceMonitor {name}: selector {selector} matches no Service")
                for endpoint in (monitor.get("spec") or {}).get("endpoints") or []:
                    for s in matched:
                        names = [p.get("name") for p in services[s][1]["spec"].get("ports") or []]
                        if endpoint.get("port") not in names:
                            self.problem(path, f"ServiceMonitor {name}: endpoint port '{endpoint.get('port')}' is no port name of Service {s} ({', '.join(map(str, names))})")
                    if endpoint.get("path", "/metrics") != "/metrics":
                        self.problem(path, f"ServiceMonitor {name}: endpoint path must be /metrics")
            if kind == "PrometheusRule":
                self.check_alert_rules(path, name, monitor)
            if kind == "PodDisruptionBudget":
                selector = ((monitor.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
                matched = [d for d, (_, o) in deployments.items() if labels_match(selector, o["_pod_labels"])]
                if len(matched) != 1:
                    self.problem(path, f"PodDisruptionBudget {name}: selector {selector} matches {len(matched)} Deployments ({', '.join(matched) or 'none'}); expected exactly one")
                spec = monitor.get("spec") or {}
                if "minAvailable" in spec and matched:
                    replicas = deployments[matched[0]][1]["spec"].get("replicas", 1)
                    if str(spec["minAvailable"]) not in ("0", "0%") and int(str(spec["minAvailable"]).rstrip("%") or 0) >= replicas and not str(spec["minAvailable"]).endswith("%"):
                        self.problem(path, f"PodDisruptionBudget {name}: minAvailable {spec['minAvailable']} with {replicas} replica(s) blocks every drain")
        for name in deployments:
            if not any(k == "PodDisruptionBudget" and labels_match(((o.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}, deployments[name][1]["_pod_labels"])
                       for (k, _), (_, o) in self.k8s.items()):
                self.problem(deployments[name][0], f"Deployment {name}: no PodDisruptionBudget selects its pods")

    def check_alert_rules(self, path, name, rule):
        """Every alert queries metrics the worker exports, has a severity, and says what fired."""
        groups = (rule.get("spec") or {}).get("groups") or []
        alerts = [r for g in groups for r in g.get("rules") or [] if "alert" in r]
        if not alerts:
            self.problem(path, f"PrometheusRule {name}: defines no alert")
        for alert in alerts:
            title = alert.get("alert")
            expr = str(alert.get("expr") or "")
            if not expr:
                self.problem(path, f"PrometheusRule {name}: alert {title} has no expr")
            self.check_queried_metrics(path, f"PrometheusRule {name}: alert {title}", expr, "alert metric references checked")
            if (alert.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
                self.problem(path, f"PrometheusRule {name}: alert {title} has no severity label (critical, warning or info)")
            if not (alert.get("annotations") or {}).get("summary"):
                self.problem(path, f"PrometheusRule {name}: alert {title} has no summary annotation")

    def check_queried_metrics(self, path, where: str, expr: str, counted: str) -> set:
        """Reports each metric `expr` queries that the worker does not export; returns the
        exported metrics it queries."""
        series = self.facts.series_names()
        used = set()
        for metric in promql_metric_names(expr, self.PROMQL_WORDS):
            self.count(counted)
            if metric in series:
                used.add(series[metric])
                continue
            close = difflib.get_close_matches(metric, sorted(series), n=1)
            self.problem(path, f"{where}: queries {metric}, which the worker does not export" + (f" (did you mean {close[0]}?)" if close else ""))
        return used

    def check_scaled_objects(self, deployments):
        scaled = [(n, p, o) for (k, n), (p, o) in self.k8s.items() if k == "ScaledObject"]
        if not scaled:
            self.problem(self.root / "deploy", "defines no KEDA ScaledObject for the push workers")
        for name, path, obj in scaled:
            spec = obj.get("spec") or {}
            target = (spec.get("scaleTargetRef") or {}).get("name")
            if target not in self.worker_deployments:
                self.problem(path, f"ScaledObject {name}: scaleTargetRef {target} is not the push worker Deployment ({', '.join(self.worker_deployments) or 'none'})")
                continue
            if "replicas" in deployments[target][1].get("spec", {}):
                self.problem(deployments[target][0], f"Deployment {target}: sets replicas although ScaledObject {name} owns them")
            effective = self.worker_deployments[target]
            partitions = (obj.get("metadata", {}).get("annotations") or {}).get("apns-fleet.io/jobs-partitions")
            maximum, minimum = spec.get("maxReplicaCount"), spec.get("minReplicaCount", 0)
            if partitions is None:
                self.problem(path, f"ScaledObject {name}: annotation apns-fleet.io/jobs-partitions (the partition count of {effective.get('topics.jobs')}) is missing")
            elif maximum is None or int(maximum) > int(partitions):
                self.problem(path, f"ScaledObject {name}: maxReplicaCount {maximum} exceeds the {partitions} partitions of {effective.get('topics.jobs')}; extra workers would sit idle")
            if maximum is not None and int(minimum) > int(maximum):
                self.problem(path, f"ScaledObject {name}: minReplicaCount {minimum} > maxReplicaCount {maximum}")
            kafka = [t for t in spec.get("triggers") or [] if t.get("type") == "kafka"]
            if not kafka:
                self.problem(path, f"ScaledObject {name}: has no kafka trigger")
            for trigger in kafka:
                meta = trigger.get("metadata") or {}
                for field, key in (("topic", "topics.jobs"), ("consumerGroup", "kafka.group-id"), ("bootstrapServers", "kafka.bootstrap-servers")):
                    if str(meta.get(field)) != str(effective.get(key)):
                        self.problem(path, f"ScaledObject {name}: trigger {field} is {meta.get(field)}, but the worker's {key} is {effective.get(key)}")
                auth = (trigger.get("authenticationRef") or {}).get("name")
                if auth:
                    entry = self.k8s.get(("TriggerAuthentication", auth))
                    if not entry:
                        self.problem(path, f"ScaledObject {name}: authenticationRef {auth} is no TriggerAuthentication")
                        continue
                    for ref in (entry[1].get("spec") or {}).get("secretTargetRef") or []:
                        keys = self.secret_keys(ref.get("name"))
                        if keys is None or ref.get("key") not in keys:
                            self.problem(entry[0], f"TriggerAuthentication {auth}: parameter {ref.get('parameter')} reads {ref.get('name')}/{ref.get('key')}, which no Secret template has")
            self.count("ScaledObjects checked")

    def render_kustomizations(self, kustomizations):
        kubectl = shutil.which("kubectl")
        if not self.externals:
            return
        if not kubectl:
            self.notes.add("kubectl not found: kustomizations were checked by reading them, not rendered")
            return
        # Debian bookworm's kubectl (1.20) embeds kustomize 2.0, which predates the `labels:` and
        # `patches:` fields the manifests use (kustomize 4.1+): its failure says nothing about them.
        kustomize = self.kustomize_version(kubectl)
        if kustomize is None or kustomize < (4, 1):
            shown = "unknown" if kustomize is None else ".".join(map(str, kustomize))
            self.notes.add(f"kubectl's kustomize ({shown}) is older than 4.1: kustomizations were checked by reading them, not rendered")
            return
        for kpath in kustomizations:
            try:
                run = subprocess.run([kubectl, "kustomize", str(kpath.parent)], capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as error:
                self.notes.add(f"kubectl kustomize did not run: {error}")
                return
            if run.returncode != 0:
                self.problem(kpath, f"kubectl kustomize fails: {run.stderr.strip()}")
                continue
            objects = [d for d in yaml.safe_load_all(run.stdout) if d]
            names = {(o.get("kind"), o["metadata"]["name"]) for o in objects}
            for o in objects:
                if o.get("kind") != "Deployment":
                    continue
                for volume in o["spec"]["template"]["spec"].get("volumes") or []:
                    if "configMap" in volume and ("ConfigMap", volume["configMap"]["name"]) not in names:
                        self.problem(kpath, f"rendered Deployment {o['metadata']['name']} mounts ConfigMap {volume['configMap']['name']}, which the rendering does not contain")
            self.count("kustomizations rendered with kubectl")

    @staticmethod
    def kustomize_version(kubectl):
        """The kustomize version kubectl embeds, as a tuple, or None when it does not say."""
        try:
            run = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30)
            text = json.loads(run.stdout).get("kustomizeVersion", "")
        except (OSError, subprocess.TimeoutExpired, ValueError, AttributeError):
            return None
        match = re.match(r"v?(\d+)\.(\d+)", text)
        return (int(match.group(1)), int(match.group(2))) if match else None

    # Dashboard --------------------------------------------------------------------------

    PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                    "offset", "inf", "nan", "le", "atan2"}

    def check_dashboard(self):
        path = self.root / "deploy/grafana/apns-fleet-dashboard.json"
        try:
            dashboard = json.loads(read(path))
        except ValueError as error:
            self.problem(path, f"is not valid JSON: {error}")
            return
        exprs = []

        def walk(panels):
            for panel in panels or []:
                for target in panel.get("targets") or []:
                    if target.get("expr"):
                        exprs.append((panel.get("title"), target["expr"]))
                walk(panel.get("panels"))
        walk(dashboard.get("panels"))
        variables = {v.get("name") for v in (dashboard.get("templating") or {}).get("list") or []}
        for variable in (dashboard.get("templating") or {}).get("list") or []:
            query = variable.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            if variable.get("type") == "query" and query:
                exprs.append((f"variable {variable.get('name')}", re.sub(r"label_values\(([^,()]+),.*\)", r"\1", query)))
        used = set()
        for title, expr in exprs:
            for var in re.findall(r"\$\{?(\w+)", expr):
                if var not in variables and not var.startswith("__"):
                    self.problem(path, f"panel '{title}': uses ${var}, which is no dashboard variable")
            used |= self.check_queried_metrics(path, f"panel '{title}'", expr, "dashboard metric references checked")
        self.count("dashboard queries parsed", len(exprs))
        # The issue asks for these views; each needs its metric on the dashboard.
        for metric, view in (("apns_worker_notifications", "throughput by outcome"), ("apns_client_latency", "latency percentiles"),
                             ("apns_client_in_flight", "in-flight work"), ("apns_client_connections_usable", "connections"),
                             ("apns_client_stream_limit", "stream limits"), ("kafka_consumer_lag", "consumer lag"),
                             ("apns_worker_retries_scheduled", "retries"), ("apns_worker_dlq", "DLQ")):
            if metric in self.facts.metrics and metric not in used:
                self.problem(path, f"no panel shows {view} ({metric})")
            if metric not in self.facts.metrics:
                self.problem(path, f"the worker no longer exports {metric} ({view}); update the dashboard and this check")
        if "histogram_quantile" not in " ".join(e for _, e in exprs):
            self.problem(path, "no latency percentile (histogram_quantile) panel")
        self.unused_metrics = sorted(set(self.facts.metrics) - used)


def promql_metric_names(expr: str, words: set) -> set:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label
    names, label values, durations or template variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)       # strings
    text = re.sub(r"\{[^{}]*\}", "", text)                                       # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                                       # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)                                     # variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in words or re.fullmatch(r"\d+\w*", name):
            continue
        names.add(name)
    return names


def option_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def seconds(value) -> float:
    text = str(value)
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "": 1}[unit]
    return total


def memory(value) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|K|M|G)?", str(value or "0"))
    if not match:
        return 0
    return float(match.group(1)) * {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9, None: 1}[match.group(2)]


def dockerignored(source: str, patterns: list[str]) -> bool:
    import fnmatch
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(source, pattern) or fnmatch.fnmatch(source, pattern + "/*") or source.startswith(pattern + "/"):
            ignored = not negate
    return ignored


# ---------------------------------------------------------------------------------------------
# Self-test: broken copies must fail
# ---------------------------------------------------------------------------------------------


def mutate_yaml(path: Path, change):
    docs = list(yaml.safe_load_all(path.read_text()))
    change(docs)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def mutate_text(path: Path, old: str, new: str):
    text = path.read_text()
    if old not in text:
        raise AssertionError(f"self-test: '{old}' not found in {path}")
    path.write_text(text.replace(old, new, 1))


def containers(docs, deployment):
    for doc in docs:
        if doc and doc.get("kind") == "Deployment" and doc["metadata"]["name"] == deployment:
            return doc["spec"]["template"]["spec"]["containers"]
    raise AssertionError(f"self-test: no Deployment {deployment}")


BREAKAGES = [
    ("a readiness probe on the wrong path", "deploy/base/worker-deployment.yaml",
     lambda p: mutate_yaml(p, lambda d: containers(d, "apns-fleet-worker")[0]["readinessProbe"]["httpGet"].__setitem__("path", "/ready")),
     "readinessProbe checks /ready"),
    ("a probe on an undeclared port", "deploy/base/worker-deployment.yaml",
     lambda p: mutate_yaml(p, lambda d: containers(d, "apns-fleet-worker")[0]["livenessProbe"]["httpGet"].__setitem__("port", "metrics")),
     "uses port 'metrics'"),
    ("a Secret key the template does not have", "deploy/base/fleet.yaml",
     lambda p: mutate_text(p, "token/AuthKey_ABC123DEFG.p8", "token/AuthKey_OTHER00000.p8"),
     "has no file AuthKey_OTHER00000.p8"),
    ("an APNS_FLEET_ variable that is no key", "docker/compose.yaml",
     lambda p: mutate_text(p, "APNS_FLEET_KAFKA_GROUP_ID:", "APNS_FLEET_KAFKA_GROUP:"),
     "APNS_FLEET_KAFKA_GROUP is no configuration key"),
    ("an app variable for an app that is not configured", "docker/compose.yaml",
     lambda p: mutate_text(p, "APNS_FLEET_APP_EXAMPLE_CONNECTIONS:", "APNS_FLEET_APP_OTHER_CONNECTIONS:"),
     "not in apps"),
    ("a config file key that does not exist", "docker/fleet.yaml",
     lambda p: mutate_text(p, "drain-timeout-seconds: 25", "drain-timeout: 25"),
     "'worker.drain-timeout' is no configuration key"),
    ("a dashboard metric the worker does not export", "deploy/grafana/apns-fleet-dashboard.json",
     lambda p: mutate_text(p, "apns_worker_dlq[", "apns_worker_dead_letters["),
     "queries apns_worker_dead_letters"),
    ("an alert on a metric the worker does not export", "deploy/base/prometheusrule.yaml",
     lambda p: mutate_text(p, "increase(kafka_consumer_stalls[10m])", "increase(kafka_consumer_stall_count[10m])"),
     "queries kafka_consumer_stall_count"),
    ("a resource file left out of kustomization.yaml", "deploy/base/kustomization.yaml",
     lambda p: mutate_text(p, "  - poddisruptionbudget.yaml\n", ""),
     "does not list poddisruptionbudget.yaml"),
    ("a grace period shorter than the drain", "deploy/base/worker-deployment.yaml",
     lambda p: mutate_text(p, "terminationGracePeriodSeconds: 55", "terminationGracePeriodSeconds: 30"),
     "terminationGracePeriodSeconds 30"),
    ("a KEDA cap above the partition count", "deploy/base/keda-scaledobject.yaml",
     lambda p: mutate_text(p, "maxReplicaCount: 24", "maxReplicaCount: 48"),
     "exceeds the 24 partitions"),
    ("a Service selecting no pods", "deploy/base/service.yaml",
     lambda p: mutate_text(p, "    app.kubernetes.io/name: apns-fleet\n  ports:", "    app.kubernetes.io/name: apns-fleat\n  ports:"),
     "matches no Deployment"),
    ("a compose dependency on a missing service", "docker/compose.yaml",
     lambda p: mutate_text(p, "    topics:\n      condition: service_completed_successfully", "    topic:\n      condition: service_completed_successfully"),
     "depends_on topic"),
    ("a simulator flag that does not exist", "docker/compose.yaml",
     lambda p: mutate_text(p, "      - --unregistered\n", "      - --unregistered-token\n"),
     "has no flag --unregistered-token"),
    ("a token-auth app that names a legacy feedback service over TLS", "deploy/base/fleet.yaml",
     lambda p: mutate_text(p, "    environment: production\n    connections: 4\n", "    environment: production\n    connections: 4\n    legacy-feedback: feedback.push.apple.com:2196\n"),
     "refuses to start"),
    ("an image ENV that overrides the port fleet.yaml sets", "docker/Dockerfile",
     lambda p: mutate_text(p, "ENV APNS_FLEET_ADMIN_HOST=0.0.0.0\n", "ENV APNS_FLEET_ADMIN_HOST=0.0.0.0 APNS_FLEET_ADMIN_PORT=8080\n"),
     "admin.port 8080 is not a container port"),
    ("an image that runs as root", "docker/Dockerfile",
     lambda p: mutate_text(p, "USER 10001:10001\nWORKDIR", "USER root\nWORKDIR"),
     "runs as root"),
]


def self_test(root: Path) -> list[str]:
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "tree"
        base.mkdir()
        for part in ("Sources", "docker", "deploy", ".dockerignore", "Package.swift"):
            source = root / part
            if source.is_dir():
                shutil.copytree(source, base / part)
            elif source.exists():
                shutil.copy2(source, base / part)
        (base / "Tests").mkdir()  # COPY Tests in the Dockerfile needs it; its contents do not matter
        clean = Checker(base, externals=False).run()
        if clean.problems:
            return [f"self-test: the unbroken copy already fails: {clean.problems[0]}"]
        for description, file, breaker, expected in BREAKAGES:
            work = Path(tmp) / "broken"
            if work.exists():
                shutil.rmtree(work)
            shutil.copytree(base, work)
            try:
                breaker(work / file)
            except AssertionError as error:
                failures.append(f"self-test ({description}): {error}")
                continue
            problems = Checker(work, externals=False).run().problems
            if not any(expected in p for p in problems):
                failures.append(f"self-test: {description} in {file} was not caught"
                                + (f" (got: {problems[0]})" if problems else " (no problem reported)"))
    return failures


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--no-self-test", action="store_true", help="skip breaking copies of the tree")
    parser.add_argument("--no-external", action="store_true", help="do not run kubectl or the built binary")
    options = parser.parse_args()

    checker = Checker(options.root, externals=not options.no_external).run()
    failures = list(checker.problems)
    if not options.no_self_test:
        self_failures = self_test(checker.root)
        failures += self_failures
    for problem in failures:
        print(f"check_packaging: {problem}")
    print("check_packaging: " + ("FAILED" if failures else "ok") + " — " + ", ".join(f"{v} {k}" for k, v in checker.counts.items()))
    facts = checker.facts
    print(f"  from the sources: {len(facts.keys)} configuration keys (env prefix {facts.env_prefix}), "
          f"{len(facts.commands)} subcommands, {len(facts.metrics)} exported metrics, worker stop = drain + {facts.stop_extra} s")
    if not options.no_self_test:
        missed = sum(1 for f in failures if f.startswith("self-test"))
        print(f"  self-test: {len(BREAKAGES)} deliberately broken copies, " + (f"{missed} NOT caught" if missed else "each caught"))
    if getattr(checker, "unused_metrics", None):
        print(f"  exported but not on the dashboard: {', '.join(checker.unused_metrics)}")
    for note in sorted(checker.notes):
        print(f"  note: {note}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
