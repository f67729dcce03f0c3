#!/usr/bin/env bash
# Set this machine up to run keel's libvirt driver and its tests (as root, Debian).
#
# Installs QEMU, libvirt (daemon, QEMU driver, headers for the Python binding),
# pkg-config, busybox and cpio, binutils (the test guest's build reads its binaries'
# libraries), genisoimage (config drives) and openssh-client (the tests SSH into guests)
# when missing; makes sure the libvirt-qemu user and
# /var/log/libvirt/qemu exist; and starts virtlogd and libvirtd when they are not
# running (there may be no systemd). With --root-guests (what CI and test machines want)
# QEMU runs guests as root, so guests can use files under any test directory; a
# production host keeps Debian's libvirt-qemu user (see docs/libvirt.md). Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

root_guests=false
[[ ${1:-} == --root-guests ]] && root_guests=true

packages=(qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients libvirt-dev
          pkg-config busybox cpio binutils genisoimage openssh-client)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if (( ${#missing[@]} )); then
    echo "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

id libvirt-qemu >/dev/null 2>&1 || useradd --system --no-create-home libvirt-qemu
mkdir -p /var/log/libvirt/qemu /run/libvirt

if $root_guests && ! grep -q '^user = "root"' /etc/libvirt/qemu.conf; then
    printf '\n# keel tests: guests run as root\nuser = "root"\ngroup = "root"\n' \
        >> /etc/libvirt/qemu.conf
    if [[ -s /run/libvirtd.pid ]] && kill -0 "$(cat /run/libvirtd.pid)" 2>/dev/null; then
        echo "restarting libvirtd to apply qemu.conf"
        kill "$(cat /run/libvirtd.pid)"
        sleep 2
    fi
fi

pgrep -x virtlogd >/dev/null || virtlogd -d
pgrep -x libvirtd >/dev/null || libvirtd -d
for _ in $(seq 1 30); do
    virsh -c qemu:///system version >/dev/null 2>&1 && break
    sleep 1
done
virsh -c qemu:///system version | grep -i "running hypervisor"
echo "libvirtd answers at qemu:///system"
