/**
 * Value patterns shared by role label selectors and connector role mappings:
 *
 * - `^...$` (starts with ^ and ends with $): a regular expression (JavaScript syntax), matched against the whole value;
 * - contains `*`: a glob, `*` standing for any run of characters (also none), everything else literal;
 * - anything else: the exact value (case-sensitive).
 */

/** A pattern written as a regular expression. */
export function isRegexPattern(pattern: string): boolean {
  return pattern.length >= 2 && pattern.startsWith('^') && pattern.endsWith('$');
}

/** Why pattern cannot be used (an invalid regular expression), or undefined when it can. */
export function patternProblem(pattern: string): string | undefined {
  if (!isRegexPattern(pattern)) return undefined;
  try {
    new RegExp(pattern);
    return undefined;
  } catch (err) {
    return `invalid regular expression ${JSON.stringify(pattern)}: ${(err as Error).message.replace(/^Invalid regular expression: \/.*\/[a-z]*: /s, '')}`;
  }
}

const MAX_CACHED = 1000;
const cache = new Map<string, (value: string) => boolean>();

function compile(pattern: string): (value: string) => boolean {
  if (isRegexPattern(pattern)) {
    let re: RegExp;
    try {
      re = new RegExp(pattern);
    } catch {
      // Validated manifests never get here; a pattern built in code that does not compile matches nothing.
      return () => false;
    }
    return (value) => re.test(value);
  }
  if (pattern.includes('*')) {
    const source = pattern
      .split('*')
      .map((part) => part.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&'))
      .join('[\\s\\S]*');
    const re = new RegExp(`^${source}$`);
    return (value) => re.test(value);
  }
  return (value) => value === pattern;
}

/** Whether value matches pattern (see the module comment for the three forms). */
export function matchValue(pattern: string, value: string): boolean {
  let fn = cache.get(pattern);
  if (fn === undefined) {
    if (cache.size >= MAX_CACHED) cache.clear();
    fn = compile(pattern);
    cache.set(pattern, fn);
  }
  return fn(value);
}

/** `{{internal.logins}}`, `{{external.groups}}`, with an optional literal prefix and suffix around it. */
export const TEMPLATE = /^([^{}]*)\{\{\s*(internal|external)\.([A-Za-z0-9_.-]+)\s*\}\}([^{}]*)$/;

const USABLE = /^[^\s\u0000-\u001f\u007f{}]{1,253}$/;

/**
 * Role values (logins, database names and users) with their templates expanded from the user's traits:
 * `{{internal.<trait>}}` and `{{external.<trait>}}` both read traits[<trait>], one value per trait value (with the
 * template's prefix and suffix around it); a missing trait gives nothing. Values that would hold spaces, control
 * characters or braces (a hostile identity provider) are dropped. Order kept, duplicates removed.
 */
export function expandTemplates(values: readonly string[] | undefined, traits: Readonly<Record<string, readonly string[]>>): string[] {
  const out = new Set<string>();
  for (const v of values ?? []) {
    const m = TEMPLATE.exec(v);
    if (!m) {
      if (USABLE.test(v)) out.add(v);
      continue;
    }
    const [, prefix = '', , trait = '', suffix = ''] = m; // every group of TEMPLATE takes part in a match
    const found = Object.hasOwn(traits, trait) ? traits[trait] : undefined;
    for (const t of Array.isArray(found) ? found : []) {
      const expanded = `${prefix}${String(t)}${suffix}`;
      if (USABLE.test(expanded)) out.add(expanded);
    }
  }
  return [...out];
}
