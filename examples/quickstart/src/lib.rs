use rivet::prelude::*;

/// RMSNorm over the last axis of an (n, d) float32 tensor: one build serves every n and d.
fn rms_norm() -> rivet::Result<Vec<(String, Function)>> {
    let (n, d) = (te::var("n"), te::var("d"));
    let x = te::placeholder([&n, &d], DType::F32, "x")?;
    let k = te::reduce_axis(0, &d, "k")?;
    let ss = te::compute([&n], |[i]| te::sum(x.at((&i, &k)) * x.at((&i, &k)), &k), "ss")?;
    let rms =
        te::compute([&n], |[i]| te::rsqrt(ss.at([i]) / te::cast(DType::F32, &d) + 1e-6), "rms")?;
    let y = te::compute([&n, &d], |[i, j]| x.at([&i, &j]) * rms.at([i]), "y")?;
    let module = build(&Schedule::new(&[&y])?, &[&x, &y], "cpu", "rms_norm")?;
    Ok(vec![("quickstart.rms_norm".into(), module.get_function("rms_norm")?)])
}

rivet::python_library!(rms_norm);
