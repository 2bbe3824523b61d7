/**
 * Release artifacts through the Proxy (issue 28, item 5): the paths both ends share and the one grammar that decides
 * which names and paths the Proxy's relay takes. The Proxy (src/proxy/artifacts.ts) answers only what parses here;
 * the upgrader (src/upgrade/) builds its download location and repository address from the same prefixes.
 *
 *   GET|HEAD /v1/webapi/autoupdate/artifacts/<release tarball name>[.sha256]
 *   GET|HEAD /v1/webapi/autoupdate/repo/<path in the package repository>
 *
 * Pure and bounded. A raw path (as it came on the request line) is checked before anything is decoded: no query,
 * at most MAX_RAW_PATH characters, at most MAX_SEGMENTS segments; each segment is percent-decoded once and must then
 * be made of the characters a repository's file names use (letters, digits, ".", "_", "-", "+", "~"), never empty,
 * never "." or "..", never starting with "." (so %2e%2e, %2f and dot files are refused as plainly as ".." is).
 * Whether a file may be kept by name (immutable: tarballs, packages, apt's pool/ and by-hash, rpm's hashed metadata) or
 * must be revalidated (an index) is decided here too.
 */

export const ARTIFACTS_PATH = '/v1/webapi/autoupdate/artifacts';
export const REPO_PATH = '/v1/webapi/autoupdate/repo';
export const ARTIFACTS_PREFIX = `${ARTIFACTS_PATH}/`;
export const REPO_PREFIX = `${REPO_PATH}/`;

/** Longer request paths are refused before any decoding (a real one is under 200 characters). */
export const MAX_RAW_PATH = 1024;
export const MAX_SEGMENTS = 16;

/** gateway-ent-v<version>-linux-<arch>[-fips]-bin.tar.gz[.sha256], as src/upgrade/tarball.ts names releases. */
const TARBALL = /^gateway-ent-v\d{1,4}\.\d{1,4}\.\d{1,4}(?:-[0-9A-Za-z.]{1,64})?-linux-(?:amd64|arm64|arm)(?:-fips)?-bin\.tar\.gz(?:\.sha256)?$/;
const SEGMENT = /^[A-Za-z0-9_+~-][A-Za-z0-9._+~-]{0,199}$/;

export type ArtifactRoute = 'artifacts' | 'repo';

export interface ArtifactPath {
  route: ArtifactRoute;
  /** The decoded path under the route's prefix ("pool/stable/v17/g/gateway/gateway_17.0.1_amd64.deb"). */
  path: string;
  /** Kept by name for good (tarballs, packages, by-hash files); otherwise an index, revalidated after a short time. */
  immutable: boolean;
}

/** Why a path is refused, said so that a command can print it. */
export class ArtifactPathError extends Error {}

/** Immutable by name: releases and packages never change under one name; by-hash and rpm's hashed metadata neither. */
export function isImmutable(route: ArtifactRoute, path: string): boolean {
  if (route === 'artifacts') return true;
  if (/\.(?:deb|udeb|rpm|drpm)$/.test(path)) return true;
  if (path.includes('/by-hash/')) return true;
  if (/(?:^|\/)pool\//.test(path)) return true; // apt's pool: a file's name carries its version
  // createrepo_c names its metadata files after their checksum: repodata/<hex>-primary.xml.gz
  return /(?:^|\/)repodata\/[0-9a-f]{40,128}-[A-Za-z0-9_.-]+$/.test(path);
}

/** The route and decoded path of a request path, or undefined when it is not under either prefix. Throws ArtifactPathError. */
export function parseArtifactPath(rawUrl: string): ArtifactPath | undefined {
  const route: ArtifactRoute | undefined = under(rawUrl, ARTIFACTS_PATH) ? 'artifacts' : under(rawUrl, REPO_PATH) ? 'repo' : undefined;
  if (route === undefined) return undefined;
  if (rawUrl.length > MAX_RAW_PATH) throw new ArtifactPathError(`the path is ${rawUrl.length} characters long, more than the ${MAX_RAW_PATH} allowed`);
  if (/[?#]/.test(rawUrl)) throw new ArtifactPathError('the path has a query or a fragment, which this route does not take');
  const prefix = route === 'artifacts' ? ARTIFACTS_PREFIX : REPO_PREFIX;
  const rest = rawUrl.startsWith(prefix) ? rawUrl.slice(prefix.length) : '';
  if (rest === '') throw new ArtifactPathError('the path names no file');
  const raw = rest.split('/');
  if (raw.length > MAX_SEGMENTS) throw new ArtifactPathError(`the path has ${raw.length} segments, more than the ${MAX_SEGMENTS} allowed`);
  const segments = raw.map(decodeSegment);
  const path = segments.join('/');
  if (route === 'artifacts' && (segments.length !== 1 || !TARBALL.test(path))) {
    throw new ArtifactPathError(`${JSON.stringify(path.slice(0, 120))} is not a release tarball name (gateway-ent-v<version>-linux-<arch>[-fips]-bin.tar.gz, or its .sha256)`);
  }
  return { route, path, immutable: isImmutable(route, path) };
}

function under(url: string, base: string): boolean {
  return url === base || url.startsWith(`${base}/`) || url.startsWith(`${base}?`);
}

function decodeSegment(raw: string): string {
  if (raw === '') throw new ArtifactPathError('the path has an empty segment');
  let decoded: string;
  try {
    decoded = decodeURIComponent(raw);
  } catch {
    throw new ArtifactPathError('the path has a bad percent-encoding');
  }
  if (decoded === '.' || decoded === '..') throw new ArtifactPathError('the path has a "." or ".." segment');
  if (!SEGMENT.test(decoded)) {
    throw new ArtifactPathError(`the segment ${JSON.stringify(decoded.slice(0, 60))} has characters a repository's file names do not use, or starts with "."`);
  }
  return decoded;
}

/** The path as sent upstream: each segment encoded again (apt writes "~" as %7e; the upstream gets one spelling). */
export function upstreamPath(path: string): string {
  return path.split('/').map(encodeURIComponent).join('/');
}
