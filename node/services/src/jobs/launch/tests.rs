use super::*;
use crate::{
    chief::{decide, tests as chief},
    cluster::membership::State,
    domain::state::ControlState,
};

#[test]
fn master_port_is_stable_in_range_and_per_cluster() {
    let id = JobId::from_log_index(12);
    assert_eq!(master_port(id, 1, "s"), master_port(id, 1, "s"));
    for g in 0..50 {
        let p = master_port(id, g, "s");
        assert!((MASTER_PORT_BASE..MASTER_PORT_BASE + MASTER_PORT_SPAN).contains(&p));
    }
    let other_cluster = (0..8)
        .filter(|i| master_port(id, 1, "s") != master_port(id, 1, &format!("t{i}")))
        .count();
    assert!(other_cluster >= 7, "another secret, another port");
}

/// A state in which the job `spec` (TOML) is placed on one alive member of `cpus` cpus.
fn placed_on_one_member(spec: &str, cpus: u32) -> (ControlState, JobId) {
    let mut state = ControlState::default();
    let id = chief::submit_text(&mut state, spec);
    let members = vec![chief::member("a", State::Alive, cpus)];
    let place = decide(&state, &members, 5, &mut || "ab".repeat(32));
    state.apply(state.applied_index + 1, &place[0]);
    (state, id)
}

#[test]
fn train_ranks_get_the_storage_url_in_their_environment_not_argv() {
    let (state, id) = placed_on_one_member("name = \"t\"\nkind = \"train\"\nworkers = 1\n", 1);
    let job = state.job(id).unwrap();
    let url = "s3://bucket?access_key_id=AK&secret_access_key=SK";
    let ctx = LaunchContext {
        storage: url.into(),
        ..LaunchContext::for_test(&job.assignment[0].member)
    };
    let l = launch(&ctx, job, &job.assignment[0], &|_| Some("127.0.0.1".into())).unwrap();
    assert!(l.command.iter().any(|a| a == "train-worker"));
    let env_secret = |l: &Launch| {
        l.env
            .iter()
            .find(|(k, _)| k == "RINGLEADER_SECRET")
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(env_secret(&l), job.ring_secret, "no key: the nonce");
    // With the cluster's ring key the secret is derived, never the replicated nonce, and
    // the same on every member.
    let keyed = LaunchContext {
        ring_key: Some(crate::cluster::key_ring::DerivedKey::fixed([7; 32])),
        ..ctx.clone()
    };
    let lk = launch(&keyed, job, &job.assignment[0], &|_| {
        Some("127.0.0.1".into())
    })
    .unwrap();
    assert_ne!(env_secret(&lk), job.ring_secret);
    assert_eq!(env_secret(&lk), ring_secret(job, Some(&[7; 32])));
    assert_ne!(env_secret(&lk), ring_secret(job, Some(&[8; 32])));
    assert!(!format!("{:?}", lk.command).contains(&env_secret(&lk)));
    assert!(
        !l.command
            .iter()
            .any(|a| a.contains("secret_access_key") || a == "--storage"),
        "{:?}",
        l.command
    );
    assert!(l.env.contains(&("RINGLEADER_STORAGE".into(), url.into())));
}

#[test]
fn train_ranks_on_one_member_write_their_own_spec_files() {
    let (state, id) = placed_on_one_member(
        "name = \"t\"\nkind = \"train\"\nworkers = 2\nplacement = \"pack\"\n",
        4,
    );
    let job = state.job(id).unwrap();
    assert_eq!(job.assignment.len(), 2);
    assert_eq!(job.assignment[0].member, job.assignment[1].member);
    let ctx = LaunchContext::for_test(&job.assignment[0].member);
    let spec_files: Vec<_> = job
        .assignment
        .iter()
        .map(|slot| {
            let l = launch(&ctx, job, slot, &|_| Some("127.0.0.1".into())).unwrap();
            let at = l.command.iter().position(|a| a == "--spec").unwrap();
            assert_eq!(l.files.len(), 1);
            assert_eq!(l.files[0].0.display().to_string(), l.command[at + 1]);
            l.files[0].0.clone()
        })
        .collect();
    // Both start at once: one file for both failed the one whose file the other replaced.
    assert_ne!(spec_files[0], spec_files[1]);
}

/// The environment value `name` of `l`, the last one set (as the process sees it).
fn env_of<'a>(l: &'a Launch, name: &str) -> Option<&'a str> {
    l.env
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn command_ranks_see_their_hosts_devices_in_local_rank_order_train_ranks_their_own() {
    let members = vec![chief::gpu_member("a", 8, 6)];
    let mut state = ControlState::default();
    let spec = |kind: &str, workers: u32, gpus: u32| {
        format!(
                "name = \"g\"\nkind = \"{kind}\"\nworkers = {workers}\nplacement = \"pack\"\n{}[resources]\ngpus_per_worker = {gpus}\n",
                if kind == "command" { "command = [\"true\"]\n" } else { "" }
            )
    };
    let command = chief::submit_text(&mut state, &spec("command", 2, 2));
    let train = chief::submit_text(&mut state, &spec("train", 2, 1));
    let cpu = chief::submit_text(&mut state, &spec("train", 1, 0));
    let cpu_command = chief::submit_text(&mut state, &spec("command", 1, 0));
    for cmd in decide(&state, &members, 5, &mut || "ab".repeat(32)) {
        state.apply(state.applied_index + 1, &cmd);
    }
    let mut ctx = LaunchContext::for_test("");
    let host = |_: &str| Some("127.0.0.1".to_string());
    let launches = |ctx: &LaunchContext, id| {
        let job = state.job(id).unwrap();
        job.assignment
            .iter()
            .map(|slot| launch(ctx, job, slot, &host).unwrap())
            .collect::<Vec<_>>()
    };
    let seen = |ls: &[Launch], key: &str| -> Vec<Option<String>> {
        ls.iter()
            .map(|l| env_of(l, key).map(str::to_owned))
            .collect()
    };
    let some = |v: &[&str]| v.iter().map(|s| Some(s.to_string())).collect::<Vec<_>>();
    // Two ranks of two devices each on one host: both see all four, local rank 0's first,
    // so `set_device(LOCAL_RANK * 2)` is each one's own; told their own count.
    let c = launches(&ctx, command);
    assert_eq!(
        seen(&c, "CUDA_VISIBLE_DEVICES"),
        some(&["0,1,2,3", "0,1,2,3"])
    );
    assert_eq!(seen(&c, "LOCAL_RANK"), some(&["0", "1"]));
    assert_eq!(seen(&c, "RINGLEADER_GPUS"), some(&["2", "2"]));
    // Train ranks: their own only (the trainer computes on device 0).
    let t = launches(&ctx, train);
    assert_eq!(seen(&t, "CUDA_VISIBLE_DEVICES"), some(&["4", "5"]));
    assert_eq!(seen(&t, "RINGLEADER_GPUS"), some(&["1", "1"]));
    // No gpu asked for, on a node that offers none: nothing said; on one that offers some:
    // none (empty), never the node's whole view.
    for id in [cpu, cpu_command] {
        let l = launches(&ctx, id);
        assert_eq!(seen(&l, "CUDA_VISIBLE_DEVICES"), [None]);
        assert_eq!(seen(&l, "RINGLEADER_GPUS"), some(&["0"]));
    }
    ctx.offers_gpus = true;
    for id in [cpu, cpu_command] {
        assert_eq!(
            seen(&launches(&ctx, id), "CUDA_VISIBLE_DEVICES"),
            some(&[""])
        );
    }
    // A node started with CUDA_VISIBLE_DEVICES: its own names for the devices.
    ctx.device_names = Some(
        ["4", "5", "6", "7", "8", "GPU-x"]
            .map(String::from)
            .to_vec(),
    );
    assert_eq!(
        seen(&launches(&ctx, train), "CUDA_VISIBLE_DEVICES"),
        some(&["8", "GPU-x"])
    );
    assert_eq!(
        seen(&launches(&ctx, command), "CUDA_VISIBLE_DEVICES"),
        some(&["4,5,6,7", "4,5,6,7"])
    );
}

#[test]
fn rank_devices_follow_local_rank_not_rank_and_stay_on_the_host() {
    let (state, id) = placed_on_one_member(
        "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\nworkers = 3\n",
        8,
    );
    let mut job = state.job(id).unwrap().clone();
    // Ranks 0 and 2 on member a (local ranks 1 and 0), rank 1 on b.
    for (slot, (member, local, gpus)) in
        job.assignment
            .iter_mut()
            .zip([("a", 1, vec![3]), ("b", 0, vec![0]), ("a", 0, vec![5])])
    {
        slot.member = member.into();
        slot.local_rank = local;
        slot.gpus = gpus;
    }
    let of = |job: &Job, r: usize| rank_devices(job, &job.assignment[r]);
    assert_eq!(
        (of(&job, 0), of(&job, 1), of(&job, 2)),
        (vec![5, 3], vec![0], vec![5, 3])
    );
    // A standby joiner on a, not yet in the assignment: its own devices after the others'.
    let standby = Slot {
        worker: 3,
        rank: 3,
        local_rank: 2,
        gpus: vec![1],
        ..job.assignment[0].clone()
    };
    assert_eq!(rank_devices(&job, &standby), [5, 3, 1]);
    job.spec.kind = JobKind::Train;
    assert_eq!((of(&job, 0), of(&job, 2)), (vec![3], vec![5]));
    job.spec.kind = JobKind::Command;
    job.assignment[0].gpus.clear();
    assert_eq!(of(&job, 0), Vec::<u32>::new());
}

#[test]
fn ranks_get_the_data_planes_interface_unless_their_spec_names_one() {
    let (state, id) = placed_on_one_member(
        "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\n[env]\nGLOO_SOCKET_IFNAME = \"eth9\"\n",
        1,
    );
    let job = state.job(id).unwrap();
    let host = |_: &str| Some("127.0.0.1".to_string());
    let mut ctx = LaunchContext::for_test(&job.assignment[0].member);
    let l = launch(&ctx, job, &job.assignment[0], &host).unwrap();
    assert_eq!(env_of(&l, "NCCL_SOCKET_IFNAME"), None);
    ctx.socket_ifname = Some("lo".into());
    let l = launch(&ctx, job, &job.assignment[0], &host).unwrap();
    assert_eq!(env_of(&l, "NCCL_SOCKET_IFNAME"), Some("lo"));
    assert_eq!(env_of(&l, "GLOO_SOCKET_IFNAME"), Some("eth9"));
    let once = l
        .env
        .iter()
        .filter(|(k, _)| k == "GLOO_SOCKET_IFNAME")
        .count();
    assert_eq!(once, 1);
}

#[test]
fn ranks_with_gpus_number_them_in_pci_order_and_load_the_nodes_libraries() {
    let members = vec![chief::gpu_member("a", 8, 4)];
    let mut state = ControlState::default();
    let spec = |kind: &str, gpus: u32, path: &str| {
        format!(
                "name = \"g\"\nkind = \"{kind}\"\nworkers = 1\n{}[env]\n{path}[resources]\ngpus_per_worker = {gpus}\n",
                if kind == "command" { "command = [\"true\"]\n" } else { "" }
            )
    };
    let theirs = "LD_LIBRARY_PATH = \"/spec/lib\"\n";
    let command = chief::submit_text(&mut state, &spec("command", 1, theirs));
    let train = chief::submit_text(&mut state, &spec("train", 1, ""));
    let cpu = chief::submit_text(&mut state, &spec("train", 0, theirs));
    let cpu_command = chief::submit_text(&mut state, &spec("command", 0, ""));
    for cmd in decide(&state, &members, 5, &mut || "ab".repeat(32)) {
        state.apply(state.applied_index + 1, &cmd);
    }
    let mut ctx = LaunchContext::for_test("");
    let host = |_: &str| Some("127.0.0.1".to_string());
    let first =
        |ctx: &LaunchContext, job: &Job| launch(ctx, job, &job.assignment[0], &host).unwrap();
    let job = |id| state.job(id).unwrap();
    let order = |l: &Launch| env_of(l, "CUDA_DEVICE_ORDER").map(str::to_owned);
    let path = |l: &Launch| env_of(l, "LD_LIBRARY_PATH").map(str::to_owned);
    let pci = Some("PCI_BUS_ID".to_string());

    // No libraries found at start: devices in PCI order, the path left as it was.
    for id in [command, train] {
        assert_eq!(order(&first(&ctx, job(id))), pci);
    }
    assert_eq!(
        path(&first(&ctx, job(command))).as_deref(),
        Some("/spec/lib")
    );
    assert_eq!(path(&first(&ctx, job(train))), None);

    // Libraries linked at start: they come first, then the spec's path or the node's; a
    // command rank (PyTorch's wheels bring their own) gets the link directory alone.
    ctx.libraries = crate::gpus::RankLibraries {
        prefix: Some("/d/cuda-libs:/opt/cuda/lib".into()),
        inherited: Some("/node/lib".into()),
    };
    assert_eq!(
        path(&first(&ctx, job(command))).as_deref(),
        Some("/d/cuda-libs:/spec/lib")
    );
    let t = first(&ctx, job(train));
    assert_eq!(
        path(&t).as_deref(),
        Some("/d/cuda-libs:/opt/cuda/lib:/node/lib")
    );
    assert_eq!(order(&t), pci);
    let once = |l: &Launch, k: &str| l.env.iter().filter(|(n, _)| n == k).count() == 1;
    assert!(once(&t, "LD_LIBRARY_PATH") && once(&t, "CUDA_DEVICE_ORDER"));

    // Ranks without devices are left alone: the spec's value, or none (the node's).
    let c = first(&ctx, job(cpu));
    assert_eq!(path(&c).as_deref(), Some("/spec/lib"));
    assert_eq!(order(&c), None);
    let cc = first(&ctx, job(cpu_command));
    assert_eq!((path(&cc), order(&cc)), (None, None));

    // A spec's own order does not win over the node's for a rank with devices.
    let mut fastest = job(command).clone();
    fastest
        .spec
        .env
        .insert("CUDA_DEVICE_ORDER".into(), "FASTEST_FIRST".into());
    assert_eq!(order(&first(&ctx, &fastest)), pci);
}

#[test]
fn command_ranks_get_their_files_dataset_and_trial_resource() {
    let mut state = ControlState::default();
    let id = chief::submit_text(
            &mut state,
            "name = \"c\"\nkind = \"command\"\ncommand = [\"python3\", \"t.py\"]\n[data]\ndataset = \"mnist\"\n[[files]]\npath = \"t.py\"\ntext = \"print(1)\"\n[[files]]\npath = \"lib/b.bin\"\nbase64 = \"AAE=\"\n",
        );
    let members = vec![chief::member("a", State::Alive, 2)];
    for cmd in decide(&state, &members, 5, &mut || "ab".repeat(32)) {
        state.apply(state.applied_index + 1, &cmd);
    }
    let ctx = LaunchContext::for_test("");
    let host = |_: &str| Some("127.0.0.1".to_string());
    let mut job = state.job(id).unwrap().clone();
    let l = launch(&ctx, &job, &job.assignment[0], &host).unwrap();
    let work = PathBuf::from(format!("/tmp/rl/jobs/{id}/generation-1/worker-0"));
    assert_eq!(l.work_dir.as_ref(), Some(&work));
    assert_eq!(
        l.files,
        [
            (work.join("t.py"), b"print(1)".to_vec()),
            (work.join("lib/b.bin"), vec![0, 1]),
        ]
    );
    assert_eq!(l.dataset.as_deref(), Some("mnist"));
    assert_eq!(env_of(&l, TRIAL_RESOURCE_ENV), None, "not a trial");
    // A trial's run to a rung is told the rung.
    job.trial_of = Some(crate::domain::search::record::TrialOf {
        search: JobId::from_log_index(1),
        trial: 3,
        metric: "acc".into(),
        target: 9,
        copy: false,
        resumable: false,
    });
    let l = launch(&ctx, &job, &job.assignment[0], &host).unwrap();
    assert_eq!(env_of(&l, TRIAL_RESOURCE_ENV), Some("9"));
    assert_eq!(env_of(&l, "RINGLEADER_TRIAL_ID"), Some("3"));
    assert_eq!(env_of(&l, TRIAL_RESUMABLE_ENV), None);
    assert_eq!(l.trial_rung, None, "the search stops it, not its rung");
    // A resumable trial's run ends at its rung.
    if let Some(of) = job.trial_of.as_mut() {
        of.resumable = true;
    }
    let l = launch(&ctx, &job, &job.assignment[0], &host).unwrap();
    assert_eq!(env_of(&l, TRIAL_RESUMABLE_ENV), Some("1"));
    assert_eq!(l.trial_rung, Some(9));
    // Without files a command rank runs where the node runs, as before.
    job.spec.files.clear();
    let l = launch(&ctx, &job, &job.assignment[0], &host).unwrap();
    assert!(l.work_dir.is_none() && l.files.is_empty());
}

#[test]
fn command_ranks_get_their_checkpoint_place_every_run_of_a_trial_the_same() {
    use super::super::checkpoint::{
        capability, CheckpointAccess, Grant, Place, CHECKPOINT_TOKEN_ENV, CHECKPOINT_URL_ENV,
    };
    let mut state = ControlState::default();
    let id = chief::submit_text(
        &mut state,
        "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\n",
    );
    let members = vec![chief::member("a", State::Alive, 2)];
    for cmd in decide(&state, &members, 5, &mut || "ab".repeat(32)) {
        state.apply(state.applied_index + 1, &cmd);
    }
    let mut ctx = LaunchContext::for_test("");
    ctx.checkpoints = Some(CheckpointAccess {
        api_url: "http://127.0.0.1:7071".into(),
        tls_sha256: None,
        key: [5; 32],
    });
    let host = |_: &str| Some("127.0.0.1".to_string());
    let mut job = state.job(id).unwrap().clone();
    let l = launch(&ctx, &job, &job.assignment[0], &host).unwrap();
    assert_eq!(
        env_of(&l, CHECKPOINT_URL_ENV),
        Some(format!("http://127.0.0.1:7071/v1/checkpoints/job/{id}").as_str())
    );
    let token = capability(&[5; 32], Grant::of(&job), &Place::Job(id));
    assert_eq!(env_of(&l, CHECKPOINT_TOKEN_ENV), Some(token.as_str()));
    // Every run of a trial (another job) gets the trial's place.
    job.trial_of = Some(crate::domain::search::record::TrialOf {
        search: JobId::from_log_index(1),
        trial: 3,
        metric: "acc".into(),
        target: 9,
        copy: false,
        resumable: false,
    });
    let l = launch(&ctx, &job, &job.assignment[0], &host).unwrap();
    let search = JobId::from_log_index(1);
    assert_eq!(
        env_of(&l, CHECKPOINT_URL_ENV),
        Some(format!("http://127.0.0.1:7071/v1/checkpoints/trial/{search}/3").as_str())
    );
    let trial = Place::Trial { search, trial: 3 };
    assert_eq!(
        env_of(&l, CHECKPOINT_TOKEN_ENV),
        Some(capability(&[5; 32], Grant::of(&job), &trial).as_str())
    );
}

#[test]
fn data_ports_follow_the_rendezvous_port() {
    let mut state = ControlState::default();
    let id = chief::submit(&mut state, 1, 2);
    let members = vec![
        chief::member("a", State::Alive, 1),
        chief::member("b", State::Alive, 1),
    ];
    let place = decide(&state, &members, 5, &mut || "ab".repeat(32));
    state.apply(2, &place[0]);
    let job = state.job(id).unwrap();
    let master = master_port(id, 1, &"ab".repeat(32));
    assert_eq!(data_port(job, 0), master + 1);
    assert_eq!(data_port(job, 1), master + 2);
    let addrs = ring_addrs(job, &|_| Some("10.0.0.1".into())).unwrap();
    assert_eq!(addrs[1].port(), master + 2);
    assert!(
        ring_addrs(job, &|_| None).is_none(),
        "an unknown host: wait"
    );
}
