/**
 * A program's commands as data, read from its commander definition: the one source of the shell completion scripts
 * (completion.ts) and of the manual pages (manpage.ts), so that neither can drift from what the program parses.
 *
 * It walks what commander shows in --help (Help.visibleCommands / visibleOptions: hidden commands and options stay
 * out) and reads each option's value from its flags: choices (commander's .choices(), or a hint given with
 * completeValues, e.g. -f's text|json|yaml, which output.ts checks itself to keep its deprecated aliases), a file or
 * a directory when the value's placeholder says so (<file>, <dir>, <path>), otherwise a free word. An option of a
 * program stays valid after its subcommands (commander reads program options anywhere), so a command's options are
 * its own plus its ancestors'. Pure: no I/O.
 */
import type { Argument, Command, Option } from 'commander';

/** What a value can be completed with. */
export type ValueHint =
  | { kind: 'choices'; values: readonly string[] }
  | { kind: 'file' }
  | { kind: 'dir' }
  /** A word the user types (a name, an address): nothing to offer. */
  | { kind: 'word' };

export interface OptionSpec {
  /** -f, --format (short first when there is one). */
  flags: string[];
  /** The value's placeholder without brackets ("format"), when the option takes a value. */
  value?: string;
  /** Whether that value may be left out ([value]). */
  valueOptional?: boolean;
  hint?: ValueHint;
  description: string;
}

export interface ArgSpec {
  name: string;
  required: boolean;
  variadic: boolean;
  description: string;
  hint: ValueHint;
}

export interface CommandSpec {
  /** The command's words from the program down: ["gwctl", "users", "add"]. */
  path: string[];
  name: string;
  aliases: string[];
  description: string;
  /** Its own options (the program's on the program). */
  options: OptionSpec[];
  /** Its own options and its ancestors': what may be typed at this level. */
  allOptions: OptionSpec[];
  args: ArgSpec[];
  commands: CommandSpec[];
}

const HINTS = new WeakMap<Option | Argument, ValueHint>();
const POSITIONAL = new WeakSet<Command>();

/**
 * commander's enablePositionalOptions (the program's options only before a subcommand: gwsh, whose subcommands
 * hand their own flags to OpenSSH), recorded so that completion and the manual do not offer the program's options
 * after a subcommand. commander keeps the setting in a private field, which only src/internals.ts may read.
 */
export function positionalOptions(program: Command): Command {
  POSITIONAL.add(program);
  return program.enablePositionalOptions();
}

/** Declares what a value may be, for completion and the manual, when commander's own .choices() would not do. */
export function completeValues<T extends Option | Argument>(target: T, values: readonly string[]): T {
  HINTS.set(target, { kind: 'choices', values: [...values] });
  return target;
}

function hintOf(target: Option | Argument, placeholder: string | undefined): ValueHint {
  const given = HINTS.get(target);
  if (given) return given;
  if (target.argChoices && target.argChoices.length > 0) return { kind: 'choices', values: [...target.argChoices] };
  const p = (placeholder ?? '').toLowerCase();
  if (/(?:^|[-_])dir(?:ectory)?$/.test(p)) return { kind: 'dir' };
  if (/(?:^|[-_])(?:file|path|pem|keytab)$/.test(p)) return { kind: 'file' };
  return { kind: 'word' };
}

function optionSpec(o: Option): OptionSpec {
  const flags = [o.short, o.long].filter((f): f is string => typeof f === 'string');
  const m = /[<[]([^>\]]+)[>\]]/.exec(o.flags);
  const spec: OptionSpec = { flags, description: o.description ?? '' };
  if (m && (o.required || o.optional)) {
    spec.value = m[1]!.replace(/\.\.\.$/, '');
    if (o.optional) spec.valueOptional = true;
    spec.hint = hintOf(o, spec.value);
  }
  return spec;
}

function argSpec(a: Argument): ArgSpec {
  return { name: a.name(), required: a.required, variadic: a.variadic, description: a.description ?? '', hint: hintOf(a, a.name()) };
}

/** The command tree of a program as its --help shows it. */
export function commandTree(cmd: Command, parent?: CommandSpec): CommandSpec {
  const help = cmd.createHelp();
  const positional = cmd.parent !== null && POSITIONAL.has(cmd.parent);
  const options = help.visibleOptions(cmd).map(optionSpec);
  const spec: CommandSpec = {
    path: parent ? [...parent.path, cmd.name()] : [cmd.name()],
    name: cmd.name(),
    aliases: cmd.aliases(),
    description: cmd.description(),
    options,
    allOptions: [...options, ...(parent && !positional ? parent.allOptions.filter((p) => !p.flags.some((f) => options.some((o) => o.flags.includes(f)))) : [])],
    args: cmd.registeredArguments.map(argSpec),
    commands: [],
  };
  for (const sub of help.visibleCommands(cmd)) {
    // commander's implicit `help [command]` is not in cmd.commands: it has no definition to walk, and is left out.
    if (!cmd.commands.includes(sub)) continue;
    spec.commands.push(commandTree(sub, spec));
  }
  return spec;
}

/** Every command of the tree, the program first, depth first. */
export function allCommands(root: CommandSpec): CommandSpec[] {
  return [root, ...root.commands.flatMap(allCommands)];
}
