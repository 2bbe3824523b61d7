/**
 * The stand-in API server's error answers, shaped as the real kube-apiserver shapes them: a metav1.Status object
 * (kind Status, apiVersion v1, status Failure, message, reason, code, details), and the authorizer's refusal text
 * built the way k8s.io/apiserver's responsewriters.forbiddenMessage and apierrors.NewForbidden build it, so that
 * kubectl prints exactly what it prints against a real cluster ("Error from server (Forbidden): pods "web" is
 * forbidden: User "alice" cannot create resource "pods/exec" in API group "" in the namespace "default"").
 */
import type { Attributes } from './rbac.js';

export interface Status {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: Record<string, never>;
  status: 'Success' | 'Failure';
  message?: string;
  reason?: string;
  details?: { name?: string; group?: string; kind?: string; causes?: Array<{ reason: string; message: string }> };
  code?: number;
}

export function failure(code: number, reason: string, message: string, details?: Status['details']): Status {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, ...(details ? { details } : {}), code };
}

/** What the real server answers when no authenticator accepts the request (anonymous auth disabled). */
export const UNAUTHORIZED = failure(401, 'Unauthorized', 'Unauthorized');

/** The real server's 413 (its MaxRequestBodyBytes is 3 MiB). */
export const TOO_LARGE = failure(413, 'RequestEntityTooLarge', 'the server has received too large of a request body');

export function notFound(resource: string, name: string): Status {
  return failure(404, 'NotFound', `${resource} "${name}" not found`, { name, kind: resource });
}

export function badRequest(message: string): Status {
  return failure(400, 'BadRequest', message);
}

/** responsewriters.forbiddenMessage. */
export function forbiddenMessage(a: Attributes): string {
  if (!a.resourceRequest) return `User "${a.user.name}" cannot ${a.verb} path "${a.path}"`;
  const resource = a.subresource ? `${a.resource}/${a.subresource}` : a.resource;
  const where = a.namespace ? `in the namespace "${a.namespace}"` : 'at the cluster scope';
  return `User "${a.user.name}" cannot ${a.verb} resource "${resource}" in API group "${a.apiGroup}" ${where}`;
}

/** responsewriters.Forbidden → apierrors.NewForbidden(GroupResource{group, resource}, name, message). */
export function forbidden(a: Attributes, reason = ''): Status {
  const msg = reason ? `${forbiddenMessage(a)}: ${reason}` : forbiddenMessage(a);
  const qualified = !a.resourceRequest ? '' : a.apiGroup ? `${a.resource}.${a.apiGroup}` : a.resource;
  const message = qualified === '' ? `forbidden: ${msg}` : a.name === '' ? `${qualified} is forbidden: ${msg}` : `${qualified} "${a.name}" is forbidden: ${msg}`;
  return failure(403, 'Forbidden', message, { ...(a.name ? { name: a.name } : {}), ...(a.apiGroup ? { group: a.apiGroup } : {}), ...(a.resource ? { kind: a.resource } : {}) });
}

/** The Status an exec's error channel carries when the command exits non-zero (kubectl exits with the code). */
export function exitStatus(command: string[], code: number): Status {
  return {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', reason: 'NonZeroExitCode',
    message: `command terminated with non-zero exit code: error executing command [${command.join(' ')}], exit code ${code}`,
    details: { causes: [{ reason: 'ExitCode', message: String(code) }] },
  };
}

export const SUCCESS: Status = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success' };
