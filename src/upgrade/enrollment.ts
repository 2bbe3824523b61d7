/**
 * Whether a cluster can drive automatic agent upgrades: self-hosted clusters need at least
 * v14.3.7 on v14, or v15.1.3 on v15 and later majors. Pre-releases count as below their release
 * (15.1.3-rc.1 < 15.1.3), as semver orders them.
 */
import semver from 'semver';

export const MIN_CLUSTER_VERSION_V14 = '14.3.7';
export const MIN_CLUSTER_VERSION_V15 = '15.1.3';
export const NEEDED_CLUSTER_VERSION = `v${MIN_CLUSTER_VERSION_V14} on v14, or v${MIN_CLUSTER_VERSION_V15} on v15 and later`;

export type Enrollment = { ok: true; version: string } | { ok: false; reason: string; needed: string };

/** serverVersion as /webapi/ping reports it ("17.0.0-dev", "v15.1.3"); undefined when it could not be read. */
export function checkClusterVersion(serverVersion: string | undefined): Enrollment {
  if (serverVersion === undefined || serverVersion.trim() === '') {
    return { ok: false, reason: 'the cluster did not report its version (/webapi/ping server_version)', needed: NEEDED_CLUSTER_VERSION };
  }
  const bare = serverVersion.trim().replace(/^v/, '');
  const v = semver.parse(bare);
  if (v === null) {
    return { ok: false, reason: `the cluster reports the version ${JSON.stringify(serverVersion)}, which is not a version number`, needed: NEEDED_CLUSTER_VERSION };
  }
  const min = v.major < 15 ? MIN_CLUSTER_VERSION_V14 : MIN_CLUSTER_VERSION_V15;
  const tooOld = v.major < 14 || (v.major <= 15 && semver.lt(v, min));
  if (tooOld) {
    const need = v.major < 14 ? `v${MIN_CLUSTER_VERSION_V14} or later` : v.major === 14 ? `v${MIN_CLUSTER_VERSION_V14} or later (v14)` : `v${MIN_CLUSTER_VERSION_V15} or later (v15)`;
    return {
      ok: false,
      reason: `the cluster runs v${v.version}, older than automatic agent upgrades need (${need})`,
      needed: NEEDED_CLUSTER_VERSION,
    };
  }
  return { ok: true, version: v.version };
}
