/**
 * The stand-in API server's few stored objects (KubeApiServerOptions.objects): what the Kubernetes updater reads and
 * patches (the agent StatefulSet or Deployment, the shared-state Secret), kept by their path. GET answers the object;
 * PATCH applies the body as the real server applies its two patch types the updater and the agent send, and bumps
 * metadata.resourceVersion:
 *
 *   application/merge-patch+json            RFC 7386: objects merged key by key, null deletes, anything else replaces
 *   application/strategic-merge-patch+json  the same, except lists of containers (and initContainers), which are
 *                                           merged by `name` as their patchMergeKey says (k8s.io/api core/v1 types.go)
 *
 * Not the real thing: no other list has a merge key here, no $patch / $retainKeys directives, no create (POST),
 * update (PUT), list or watch of these objects, no admission or validation; a patch of a path not stored is 404.
 */
import { failure, type Status } from './status.js';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type JsonObject = { [k: string]: Json };

const isObject = (v: Json | undefined): v is JsonObject => typeof v === 'object' && v !== null && !Array.isArray(v);
const MERGED_BY_NAME = new Set(['containers', 'initContainers']);

function merge(target: Json | undefined, patch: Json, strategic: boolean, key = ''): Json {
  if (!isObject(patch)) {
    if (strategic && MERGED_BY_NAME.has(key) && Array.isArray(patch) && Array.isArray(target)) return mergeByName(target, patch);
    return patch;
  }
  const out: JsonObject = isObject(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = merge(out[k], v, strategic, k);
  }
  return out;
}

function mergeByName(target: Json[], patch: Json[]): Json[] {
  const out = [...target];
  for (const item of patch) {
    const name = isObject(item) ? item.name : undefined;
    const at = out.findIndex((t) => isObject(t) && t.name === name);
    if (at >= 0) out[at] = merge(out[at], item, true);
    else out.push(item);
  }
  return out;
}

export class ObjectStore {
  private readonly objects = new Map<string, JsonObject>();

  constructor(initial: Record<string, object> = {}) {
    for (const [path, o] of Object.entries(initial)) this.objects.set(path, structuredClone(o) as JsonObject);
  }

  has(path: string): boolean {
    return this.objects.has(path);
  }

  get(path: string): JsonObject | undefined {
    const o = this.objects.get(path);
    return o === undefined ? undefined : structuredClone(o);
  }

  /** Applies a PATCH body; the answer is the patched object, or the Status the real server would send. */
  patch(path: string, contentType: string, body: string): { json: JsonObject } | { status: Status } {
    const current = this.objects.get(path);
    if (current === undefined) return { status: failure(404, 'NotFound', `${path} not found`) };
    const type = contentType.split(';')[0]!.trim();
    if (type !== 'application/merge-patch+json' && type !== 'application/strategic-merge-patch+json') {
      return { status: failure(415, 'UnsupportedMediaType', `the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json`) };
    }
    let patch: Json;
    try {
      patch = JSON.parse(body) as Json;
    } catch {
      return { status: failure(400, 'BadRequest', 'error decoding patch: invalid JSON') };
    }
    if (!isObject(patch)) return { status: failure(400, 'BadRequest', 'error decoding patch: not an object') };
    const next = merge(current, patch, type === 'application/strategic-merge-patch+json') as JsonObject;
    const metadata = isObject(next.metadata) ? next.metadata : {};
    next.metadata = { ...metadata, resourceVersion: String(Number(isObject(current.metadata) ? current.metadata.resourceVersion ?? 0 : 0) + 1) };
    this.objects.set(path, next);
    return { json: structuredClone(next) };
  }
}
