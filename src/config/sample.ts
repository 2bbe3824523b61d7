/**
 * The schema table printed for people: sampleConfig() for `gateway configure`, referenceRows() for the tables in
 * docs/configuration.md (a test checks the docs against them).
 */
import { defaultConfig } from './parse.js';
import { SCHEMA } from './schema.js';
import { Dynamic, defaultText, fieldRows, isListOf, type AnySpec, type Leaf, type ListOf, type ListWithDefault, type MapOf } from './spec.js';

interface Line {
  code: string;
  comment?: string;
}

const COMMENT_COLUMN_MAX = 44;

/**
 * A commented YAML configuration holding every section and key with its default. Keys whose default is computed
 * (node name, cluster name) or that are off unless set are shown commented out: remove the "# " to set them.
 * Parsing it gives defaultConfig().
 */
export function sampleConfig(): string {
  const defaults: Readonly<Record<string, unknown>> = { ...defaultConfig() };
  const lines: Line[] = [
    { code: '# Gateway configuration, as written by `gateway configure`.' },
    { code: '# Every key is shown with its default. Keys that are commented out have no fixed default;' },
    { code: '# remove the "# " in front of one to set it. The reference is docs/configuration.md.' },
  ];
  for (const [name, spec] of Object.entries(SCHEMA.fields)) {
    lines.push({ code: '' }, { code: `# ${spec.doc}` }, { code: `${name}:` });
    renderFields(spec as AnySpec, defaults[name], '  ', lines);
  }
  const width = Math.min(COMMENT_COLUMN_MAX, Math.max(...lines.filter((l) => l.comment).map((l) => l.code.length)) + 2);
  return `${lines
    .map((l) => (l.comment === undefined ? l.code : `${l.code.padEnd(width - 1)} # ${l.comment}`))
    .join('\n')}\n`;
}

function renderFields(spec: AnySpec, value: unknown, indent: string, out: Line[]): void {
  if (spec.kind !== 'section') return;
  const values = value as Record<string, unknown>;
  for (const [key, child] of Object.entries(spec.fields) as Array<[string, AnySpec]>) {
    if (child.kind === 'section') {
      out.push({ code: `${indent}${key}:`, comment: child.doc });
      renderFields(child, values[key], `${indent}  `, out);
    } else if (child.kind === 'map') {
      out.push({ code: `${indent}${key}:`, comment: `${child.doc} Default: none.` });
      renderExample(child, `${indent}  `, out);
    } else {
      out.push(renderLeaf(key, child, values[key], indent));
      if (isListOf(child)) renderListExample(child, `${indent}  `, out);
    }
  }
}

function renderLeaf(key: string, spec: Leaf<unknown>, value: unknown, indent: string): Line {
  const d = spec.default;
  if (d instanceof Dynamic && d.inSample === 'value') return { code: `${indent}${key}: ${spec.render(value)}`, comment: spec.doc };
  if (d instanceof Dynamic) {
    return { code: `${indent}# ${key}: ${spec.render(value)}`, comment: `${spec.doc} Default: ${d.doc.replace(/`/g, '')}.` };
  }
  if (d === undefined) {
    return { code: `${indent}# ${key}: ${spec.example ?? ''}`, comment: `${spec.doc} Default: ${spec.defaultDoc ?? 'none'}.` };
  }
  return { code: `${indent}${key}: ${spec.render(value)}`, comment: spec.doc };
}

function renderExample(spec: MapOf<unknown>, indent: string, out: Line[]): void {
  const value = spec.value as AnySpec;
  for (const [name, fields] of Object.entries(spec.example)) {
    out.push({ code: `${indent}# ${name}:`, comment: value.doc });
    for (const [key, text] of Object.entries(fields)) {
      const child = value.kind === 'section' ? (value.fields[key] as AnySpec | undefined) : undefined;
      out.push({ code: `${indent}  # ${key}: ${text}`, ...(child ? { comment: child.doc } : {}) });
    }
  }
}

/** One entry of a list, commented out under its (empty) list: remove the "[]" and the "# " to use it. */
/** A list's commented-out example entry, when its spec has one (listWithDefault's exampleItem). */
function renderListExample(spec: ListOf<unknown> & Pick<ListWithDefault<unknown>, 'exampleItem'>, indent: string, out: Line[]): void {
  if (spec.exampleItem === undefined) return;
  const item = spec.item as AnySpec;
  Object.entries(spec.exampleItem).forEach(([key, text], i) => {
    const child = item.kind === 'section' ? (item.fields[key] as AnySpec | undefined) : undefined;
    const comment = i === 0 ? `Example entry: remove "[]" above and the "# " to use it. ${child?.doc ?? ''}`.trim() : child?.doc;
    out.push({ code: `${indent}# ${i === 0 ? '- ' : '  '}${key}: ${text}`, ...(comment ? { comment } : {}) });
  });
}

export interface ReferenceRow {
  /** Key path; a user-chosen map key appears as its placeholder (`<channel>`). */
  readonly path: string;
  readonly type: string;
  /** As the docs write it: a value in backticks, or a sentence. */
  readonly default: string;
  readonly doc: string;
}

/** One row per key of the schema, for the reference tables of docs/configuration.md. */
export function referenceRows(): ReferenceRow[] {
  return fieldRows(SCHEMA as AnySpec).map(({ path, spec }) => {
    if (spec.kind === 'leaf') return { path, type: spec.type, default: defaultText(spec), doc: spec.doc };
    if (spec.kind === 'map') return { path, type: spec.type, default: 'none', doc: spec.doc };
    return { path, type: 'section', default: '', doc: spec.doc };
  });
}
