// .rpm packages: rpmbuild (Debian's rpm package) from the same trees as the .deb, payload gzip level 1.
//
// Version: the package version (17.0.0~dev: "~" sorts before the release in RPM too), release 1; dnf and yum
// install `gateway-<version>` and zypper `gateway=<version>` (src/upgrade/packages.ts), without the release.
// Scriptlets are Lua (run inside rpm, no /bin/sh needed in the target root: `dnf --installroot` into an empty
// root works): the same rules as the .deb's maintainer scripts (deb.mjs), as %systemd_post / %systemd_preun /
// %systemd_postun_with_restart would do, without enabling anything. Automatic dependencies are off: the runtime
// needs only glibc and libstdc++, which every system with dnf, yum or zypper has (docs/install.md).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { HOMEPAGE, MAINTAINER, run } from './common.mjs';

export const RPM_UNIT_DIR = '/usr/lib/systemd/system';

/** Lua: run a program without a shell (rpm.execute, rpm >= 4.15), or through os.execute on older rpm. */
const EXEC = 'local function x(...) if rpm.execute then rpm.execute(...) else os.execute(table.concat({...}, " ") .. " >/dev/null 2>&1") end end';
const SYSTEMD = 'local systemd = posix.access("/run/systemd/system")';

export function rpmScriptlets(units) {
  const list = units.map((u) => `"${u}"`).join(', ');
  return [
    '%post -p <lua>',
    EXEC,
    SYSTEMD,
    'if systemd then x("systemctl", "daemon-reload") end',
    '',
    '%preun -p <lua>',
    EXEC,
    SYSTEMD,
    `if systemd and tonumber(arg[2]) == 0 then x("systemctl", "disable", "--now", ${list}) end`,
    '',
    '%postun -p <lua>',
    EXEC,
    SYSTEMD,
    'if systemd then',
    '  x("systemctl", "daemon-reload")',
    `  if tonumber(arg[2]) >= 1 then x("systemctl", "try-restart", "${units[0]}") end`,
    'end',
    '',
  ].join('\n');
}

/** Every path under root that the package owns, as %files lines. */
function filesSection(tree, { conffiles, ownDirs }) {
  // A directory listed without %dir is the package's with everything under it (removed with the package).
  const lines = ['%files', '%defattr(-,root,root,-)', ...ownDirs];
  const all = run('find', ['.', '-mindepth', '1', '(', '-type', 'f', '-o', '-type', 'l', ')'], { cwd: tree })
    .split('\n')
    .filter(Boolean)
    .map((p) => p.slice(1))
    .filter((p) => !p.startsWith('/DEBIAN/') && !p.startsWith('/usr/share/lintian/') && !ownDirs.some((d) => p.startsWith(`${d}/`)))
    .sort();
  for (const p of all) {
    const quoted = /[\s%]/.test(p) ? `"${p.replaceAll('%', '%%')}"` : p;
    lines.push(conffiles.includes(p) ? `%config(noreplace) ${quoted}` : quoted);
  }
  return lines.join('\n');
}

export function buildRpm(tree, outDir, work, o) {
  const { name, rpmVersion, arch, summary, description, requires, conflicts, units, conffiles, ownDirs } = o;
  const spec = [
    `Name: ${name}`,
    `Version: ${rpmVersion}`,
    'Release: 1',
    `Summary: ${summary}`,
    'License: Apache-2.0',
    `URL: ${HOMEPAGE}`,
    `Packager: ${MAINTAINER}`,
    `BuildArch: ${arch}`,
    'AutoReqProv: no',
    ...(requires ? [`Requires: ${requires}`] : []),
    ...(conflicts ? [`Conflicts: ${conflicts}`] : []),
    '',
    '%description',
    description,
    '',
    '%install',
    `cp -al ${tree}/. %{buildroot}/`,
    'rm -rf %{buildroot}/DEBIAN %{buildroot}/usr/share/lintian',
    '',
    units.length > 0 ? rpmScriptlets(units) : '',
    filesSection(tree, { conffiles, ownDirs }),
    '',
  ].join('\n');
  mkdirSync(work, { recursive: true });
  const specFile = join(work, `${name}.spec`);
  writeFileSync(specFile, spec);
  const defs = {
    _topdir: work,
    _rpmdir: outDir,
    _build_name_fmt: '%%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm',
    _binary_payload: 'w1.gzdio',
    _build_id_links: 'none',
    debug_package: '%{nil}',
    __os_install_post: '%{nil}',
    _dbpath: join(work, 'db'),
  };
  const args = ['-bb', '--quiet', '--buildroot', join(work, 'buildroot')];
  for (const [k, v] of Object.entries(defs)) args.push('--define', `${k} ${v}`);
  run('rpmbuild', [...args, specFile], { env: { ...process.env, HOME: work } });
  return join(outDir, `${name}-${rpmVersion}-1.${arch}.rpm`);
}
