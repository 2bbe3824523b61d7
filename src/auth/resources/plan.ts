/**
 * The plan of `gwctl apply`, as pure functions shared by the Auth Service (which computes it) and gwctl (which
 * prints it): the labels that mark what apply manages, how a resource is compared with what is stored, and how an
 * update is shown (a unified diff of the YAML, secrets as ***).
 *
 * Marking: every resource apply writes carries two labels, MANAGED_BY_LABEL = MANAGED_BY and APPLY_SET_LABEL =
 * the apply set's name (as kubectl's applyset labels its members); `--prune` deletes only resources with both,
 * for the same set, so a preset role (never stored) or a resource made by hand (no labels) is never pruned.
 *
 * Secrets: the server compares them, since it stores them (connector client secrets and private keys as written,
 * tokens by their SHA-256): no hash of a secret is put in metadata, where every reader of the resource could take
 * it away and guess at it offline. The diff shows a secret as ***, and a changed one as "*** (changed)".
 */
import { toYaml } from './manifest.js';
import { unifiedDiff } from './diff.js';
import type { Resource } from './types.js';

export const MANAGED_BY_LABEL = 'gateway.dev/managed-by';
export const MANAGED_BY = 'gwctl-apply';
export const APPLY_SET_LABEL = 'gateway.dev/apply-set';
export const DEFAULT_APPLY_SET = 'default';
/** An apply set's name: a label value, short and plain. */
export const APPLY_SET_NAME = /^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$/;
/** Resources in one apply (documents of all files together): above it, GW_ERR_APPLY_TOO_LARGE. */
export const MAX_APPLY_RESOURCES = 1000;
/** Characters of all files together (the Auth API's cap on one manifest of gwctl create). */
export const MAX_APPLY_BYTES = 1024 * 1024;
/** Files in one apply (a directory of more is refused before any is read). */
export const MAX_APPLY_FILES = 256;

export type PlanAction = 'create' | 'update' | 'unchanged' | 'delete';

export interface PlanEntry {
  kind: string;
  /** The name as shown (a token's id, never the token). */
  name: string;
  action: PlanAction;
  /** For update (and create / delete): the unified diff of the YAML, secrets as ***. */
  diff?: string;
}

export interface ApplyResult {
  set: string;
  dry_run: boolean;
  /** True when the changes were written (or there were none to write). */
  applied: boolean;
  plan: PlanEntry[];
}

/** A copy of the resource carrying the apply set's labels. */
export function withApplyLabels<R extends Resource>(resource: R, set: string): R {
  return { ...resource, metadata: { ...resource.metadata, labels: { ...(resource.metadata.labels ?? {}), [MANAGED_BY_LABEL]: MANAGED_BY, [APPLY_SET_LABEL]: set } } };
}

/** Whether a stored resource belongs to the apply set (both labels). */
export function inApplySet(resource: Resource, set: string): boolean {
  const labels = resource.metadata.labels as Record<string, unknown> | undefined;
  return labels?.[MANAGED_BY_LABEL] === MANAGED_BY && labels[APPLY_SET_LABEL] === set;
}

/** JSON with sorted keys: equal resources give equal text whatever order their keys were written in. */
export function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    v !== null && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v,
  );
}

const SECRET_PATHS: ReadonlyArray<readonly string[]> = [['spec', 'client_secret'], ['spec', 'signing_key_pair', 'private_key']];

function getPath(o: unknown, path: readonly string[]): unknown {
  let at = o;
  for (const k of path) at = at !== null && typeof at === 'object' ? (at as Record<string, unknown>)[k] : undefined;
  return at;
}

function setPath(o: unknown, path: readonly string[], value: string): void {
  let at = o as Record<string, unknown>;
  for (const k of path.slice(0, -1)) at = at[k] as Record<string, unknown>;
  at[path[path.length - 1]!] = value;
}

/** Copies of before and after with each secret replaced by *** (and by "*** (changed)" in after when it differs). */
function redactPair(before: Resource | undefined, after: Resource | undefined): [Resource | undefined, Resource | undefined] {
  const b = before === undefined ? undefined : structuredClone(before);
  const a = after === undefined ? undefined : structuredClone(after);
  for (const path of SECRET_PATHS) {
    const vb = getPath(b, path);
    const va = getPath(a, path);
    if (vb !== undefined) setPath(b, path, '***');
    if (va !== undefined) setPath(a, path, vb !== undefined && vb !== va ? '*** (changed)' : '***');
  }
  return [b, a];
}

/** The diff of one plan entry: YAML of what is stored (before) and of what apply writes (after), secrets redacted. */
export function planDiff(ref: string, before: Resource | undefined, after: Resource | undefined): string {
  const [b, a] = redactPair(before, after);
  return unifiedDiff(b ? toYaml([b]) : '', a ? toYaml([a]) : '', { before: `${ref} (stored)`, after: `${ref} (${a ? 'apply' : 'deleted'})` });
}

/** One line per entry and a summary, as `gwctl apply` prints its plan; diffs indented under their entry. */
export function planText(result: ApplyResult, withDiff = true): string {
  const lines: string[] = [];
  for (const e of result.plan) {
    lines.push(`${e.kind}/${e.name}: ${e.action}`);
    if (withDiff && e.diff && e.action === 'update') lines.push(...e.diff.replace(/\n$/, '').split('\n').map((l) => `    ${l}`));
  }
  const count = (a: PlanAction): number => result.plan.filter((e) => e.action === a).length;
  lines.push(`Plan (apply set "${result.set}"): ${count('create')} to create, ${count('update')} to update, ${count('delete')} to delete, ${count('unchanged')} unchanged.`);
  return lines.join('\n');
}

/** Whether the plan changes anything. */
export function hasChanges(result: ApplyResult): boolean {
  return result.plan.some((e) => e.action !== 'unchanged');
}
